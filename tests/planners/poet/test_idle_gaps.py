"""The idle-gap rows (docs/solve.md, NOTE 6) against exact optima of POET's MILP (real HiGHS): with them the
interval relaxation keeps its optimum (never above POET's), its LP is never below the LP without them, and
on a residual graph the LP alone proves more than the eviction bound."""

from __future__ import annotations

import pytest

from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.bounds import eviction_bound, eviction_demands
from poetlab.planners.poet.idle_gaps import gap_columns
from poetlab.planners.poet.intervals import interval_bound
from poetlab.planners.poet.milp import MilpOptions, build_milp

from bound_cases import GRAPHS, LEVERS, OTHERS, QUICK, setup
from small_graphs import residual

SLOW = [pytest.param(*case, marks=pytest.mark.slow) for case in OTHERS]


def _options(graph, platform, fraction, levers):
    costs, peak, footprint = setup(graph, platform)
    extra = 2 * graph.param_bytes if levers.get("params_in_budget") else 0
    return costs, MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)) + extra, runtime_budget_factor=1.2, **levers)


@pytest.mark.parametrize("model,platform,fraction,levers", QUICK + SLOW)
def test_gap_rows_keep_the_optimum_and_never_weaken_the_lp(model, platform, fraction, levers):
    graph = GRAPHS[model]()
    costs, options = _options(graph, platform, fraction, LEVERS[levers])
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
    plain = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9)
    gaps = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    plain_lp = interval_bound(graph, costs, options, integral=False)
    gaps_lp = interval_bound(graph, costs, options, integral=False, gap_rows=True)
    assert gaps_lp.bound_j >= plain_lp.bound_j * (1 - 1e-9) and gaps_lp.bound_j >= costs.plain_step_energy_j
    if gaps.optimal:  # (an infeasible relaxation proves nothing and returns the trivial bound; so does POET's MILP)
        assert gaps_lp.bound_j <= gaps.bound_j * (1 + 1e-7)
    if plain.optimal and gaps.optimal:  # the rows cut off no integral point of the relaxation
        assert gaps.bound_j == pytest.approx(plain.bound_j, rel=1e-7)
    if exact.status == "optimal":
        assert gaps.bound_j <= exact.objective * (1 + 1e-7)
    else:
        assert exact.status == "infeasible"


def test_the_lp_with_gap_rows_proves_more_than_the_eviction_bound_on_a_residual_graph():
    """The residual graph on m0 at 5% of the way, 1.2x: the eviction bound is 1.035124 plain steps, the
    interval relaxation's LP 1.049884; with the gap rows its LP is 1.051848, within the optimum 1.061737."""
    graph = residual()
    costs, options = _options(graph, "m0", 0.05, {})
    unit = costs.plain_step_energy_j
    plain_lp = interval_bound(graph, costs, options, integral=False).bound_j
    gaps_lp = interval_bound(graph, costs, options, integral=False, gap_rows=True).bound_j
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1)
    assert exact.status == "optimal"
    assert max(plain_lp, eviction_bound(graph, costs, options)) * (1 + 1e-4) < gaps_lp <= exact.objective * (1 + 1e-7)
    assert gaps_lp / unit == pytest.approx(1.051848, abs=1e-6)


def test_every_live_tensor_at_a_row_stage_has_the_gap_its_next_use_ends():
    graph = residual()
    costs, options = _options(graph, "m0", 0.05, {})
    stages = [t for t, _, _ in eviction_demands(graph, float(options.ram_budget_bytes))]
    assert stages
    tracked = [list(range(t)) for t in stages]
    first, live = gap_columns(graph, stages, tracked)
    gaps = list(first)
    for a, j, g in live:
        t = stages[a]
        j_, u = gaps[g]
        assert j_ == j and u == min(k for k in graph.consumers[j] if k > t) and t not in graph.consumers[j]
        assert stages[first[gaps[g]]] <= t  # a gap's first row stage comes first
    for a, t in enumerate(stages):  # and nothing live is left out
        expected = {j for j in range(t) if j not in graph.nodes[t].inputs and any(k > t for k in graph.consumers[j])}
        assert {j for a_, j, _ in live if a_ == a} == expected

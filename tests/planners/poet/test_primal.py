"""The primal phase (docs/solve.md, NOTE 18): the interval relaxation restricted to the eviction cover's
recomputations, real HiGHS, every schedule replayed by the simulator."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from poetlab.core.schedule import InvalidScheduleError
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.poet.bounds import eviction_bound, eviction_cover
from poetlab.planners.poet.intervals import interval_bound
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.primal import cover_restricted
from poetlab.planners.poet.solver import solve

from bound_cases import GRAPHS, setup
from solve_checks import grid_instance


@pytest.mark.parametrize("model,platform,fraction", [("relu_chain", "m4", 0.05), ("residual", "m0", 0.2), ("convnet", "m4", 0.2)])
def test_the_restriction_lies_between_the_relaxation_and_no_recomputation(model, platform, fraction):
    """Solved to optimality: every tensor allowed to be recomputed gives the relaxation's own optimum (the restriction
    fixes nothing); the cover's recomputations give no less; none at all gives no less than the cover's. The
    eviction cover comes with the eviction bound's value."""
    graph = GRAPHS[model]()
    costs, peak, footprint = setup(graph, platform)
    options = MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)), runtime_budget_factor=1.2)
    cover = eviction_cover(graph, costs, options)
    assert cover.bound_j == eviction_bound(graph, costs, options) and cover.recompute.shape == (graph.n_nodes,)
    plain = costs.plain_step_energy_j
    relaxed = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    assert relaxed.optimal
    values = []
    for recompute in (np.ones(graph.n_nodes, dtype=bool), cover.recompute, np.zeros(graph.n_nodes, dtype=bool)):
        found = cover_restricted(graph, costs, options, recompute, time_limit_s=60, mip_gap=1e-9)
        assert found.value is not None and not found.reached
        values.append(found.value)
    assert values[0] == pytest.approx(relaxed.incumbent, abs=1e-9)
    assert values[0] <= values[1] + 1e-9 <= values[2] + 2e-9
    assert relaxed.bound_j / plain <= values[1] + 1e-9


def test_without_recomputation_in_the_gaps_a_relu_chain_pays_more():
    """A chain of ten ReLUs on the M4 at 5%: the relaxation recomputes activations inside their idle gaps; with no
    tensor allowed that (every ZR column at 0) it must page or hold them instead, at a higher optimum. So the
    restriction binds, and on the ZR columns (fixing the ZP columns instead would leave recomputation free)."""
    graph = GRAPHS["relu_chain"]()
    costs, peak, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=int(footprint + 0.05 * (peak - footprint)), runtime_budget_factor=1.2)
    free = cover_restricted(graph, costs, options, np.ones(graph.n_nodes, dtype=bool), time_limit_s=60, mip_gap=1e-9)
    none = cover_restricted(graph, costs, options, np.zeros(graph.n_nodes, dtype=bool), time_limit_s=60, mip_gap=1e-9)
    assert none.value > free.value + 1e-6


def test_a_floor_stops_at_the_first_solution_below_it():
    """With a floor above every solution, HiGHS stops at its first one and says it reached the floor."""
    graph, costs, options, replay, _ = grid_instance("resnet18_cifar", "m4", 0.2, 1.2)
    cover = eviction_cover(graph, costs, options)
    found = cover_restricted(graph, costs, options, cover.recompute, time_limit_s=30, floor_j=10 * costs.plain_step_energy_j)
    assert found.reached and found.value is not None and found.schedule is not None and found.seconds < 30
    try:
        assert replay(found.schedule).energy_j >= cover.bound_j * (1 - 1e-9)
    except InvalidScheduleError:
        pass  # (a restriction's schedule may be over a budget: the caller repairs it)


@pytest.mark.slow
def test_fig4_resnet18_on_the_m4_at_20_percent_is_certified_by_the_primal_phase(caplog):
    """Fig. 4's resnet18/m4 at 20%, 1.000177x (0.442 s of slack): before NOTE 18 no phase found a schedule within 0.1%
    of the eviction bound (1.021446) in 60 s (1.0235 at best, 0.20%); the relaxation restricted to the cover's
    recomputations gives one within 0.05% of it in seconds, and the solve ends certified."""
    from poetlab import CostModel, build_paper_graph, load_platform
    from poetlab.core.schedule import simulate

    graph = build_paper_graph("resnet18", 1)
    costs = CostModel.from_flops(graph, load_platform("m4"))
    ram = budget_ladder(graph, costs, [0.2])[0]
    with caplog.at_level(logging.INFO, logger="poetlab"):
        result = solve(graph, costs, ram, 1.000177, time_limit_s=60, threads=1, mip_gap=1e-3)
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("cover-restricted relaxation start") for m in messages)
    assert result.status == "optimal", result.message
    replayed = simulate(result.schedule, graph, costs, ram_budget_bytes=ram, runtime_budget_s=1.000177 * costs.plain_step_runtime_s, fixed_bytes=graph.reserved_bytes)
    assert result.energy_j == pytest.approx(replayed.energy_j) and result.bound_j <= result.energy_j
    assert result.energy_j < 1.0225 * costs.plain_step_energy_j

"""CP-SAT as a backend for the interval relaxation (docs/solve.md, NOTE 14), with the real solver where OR-Tools is
installed (skipped otherwise): its bound never above the exact optimum of the problem it was given (costs and the
runtime row rounded only ever downwards), between HiGHS's proven bound and its incumbent where both prove the relaxation's optimum, and on bert/m4
at its smallest footprint (slow) the relaxation's optimum, which a schedule meets. Without OR-Tools: one line
naming ``pip install ortools``."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import simulate
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.cpsat import CpsatUnavailableError, interval_bound_cpsat, solve_cpsat
from poetlab.planners.poet.intervals import interval_bound
from poetlab.planners.poet.milp import MilpOptions, build_milp

from bound_cases import GRAPHS, LEVERS, QUICK, setup


def test_without_ortools_the_error_names_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ortools", None)
    monkeypatch.setitem(sys.modules, "ortools.sat", None)
    monkeypatch.setitem(sys.modules, "ortools.sat.python", None)
    with pytest.raises(CpsatUnavailableError, match="pip install ortools"):
        solve_cpsat(np.ones(1), sp.csr_matrix(np.ones((1, 1))), np.zeros(1), np.ones(1), np.zeros(1), np.ones(1))


@pytest.mark.parametrize("seed", range(8))
def test_rounded_costs_and_a_fractional_row_only_lower_the_bound(seed):
    """A covering problem with fractional costs, integral rows and one fractional budget row (like POET's runtime
    row): CP-SAT's proven bound is never above the exact optimum (scipy's HiGHS at a gap of 0), and within the
    rounding of it."""
    pytest.importorskip("ortools.sat.python.cp_model")
    rng = np.random.default_rng(seed)
    n, m = 30, 12
    cover = (rng.random((m, n)) < 0.3).astype(float)
    time_row = rng.random(n) * 0.37
    A = sp.csr_matrix(np.vstack([cover, time_row]))
    lower = np.append(np.ones(m), -np.inf)
    upper = np.append(np.full(m, np.inf), time_row.sum() / 3)
    c = rng.random(n) / 7
    exact = milp(c, constraints=[LinearConstraint(A, lower, upper)], integrality=np.ones(n), bounds=Bounds(0, 1), options={"mip_rel_gap": 0})
    found = solve_cpsat(c, A, lower, upper, np.zeros(n), np.ones(n), time_limit_s=20, mip_gap=0)
    if exact.status == 2:
        assert found.status in ("infeasible", "optimal")
        return
    assert found.status == "optimal"
    assert found.bound <= exact.fun + 1e-12
    assert found.bound >= exact.fun - 1e-6


def test_a_fractional_row_met_with_equality_stays_feasible():
    """Three columns that every solution sets, each taking 0.1 s of a 0.3 s budget (in floating point their sum is
    above 0.3): rounding the row's coefficients down keeps the only solution, at its cost."""
    pytest.importorskip("ortools.sat.python.cp_model")
    A = sp.csr_matrix(np.vstack([np.eye(3), np.full(3, 0.1)]))
    found = solve_cpsat(np.array([0.3, 0.7, 0.11]), A, np.append(np.ones(3), -np.inf), np.append(np.full(3, np.inf), 0.3), np.zeros(3), np.ones(3), time_limit_s=5, mip_gap=0)
    assert found.status == "optimal" and found.objective == pytest.approx(1.11)
    assert 1.11 - 1e-8 <= found.bound <= 1.11


@pytest.mark.parametrize("model,platform,fraction,levers", QUICK)
def test_cpsat_proves_what_highs_proves_and_never_above_the_optimum(model, platform, fraction, levers):
    pytest.importorskip("ortools.sat.python.cp_model")
    graph = GRAPHS[model]()
    costs, peak, footprint = setup(graph, platform)
    extra = 2 * graph.param_bytes if LEVERS[levers].get("params_in_budget") else 0
    options = MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)) + extra, runtime_budget_factor=1.2, **LEVERS[levers])
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
    highs = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    found = interval_bound_cpsat(graph, costs, options, time_limit_s=60)
    assert found.optimal and highs.optimal
    # HiGHS's bound is its incumbent less the absolute gap it may stop at (bounds.proven_extra): the optimum lies between
    assert highs.bound_j * (1 - 1e-9) <= found.bound_j <= highs.incumbent * costs.plain_step_energy_j * (1 + 1e-9)
    if exact.status == "optimal":
        assert found.bound_j <= exact.objective * (1 + 1e-7)


@pytest.mark.slow
def test_cpsat_certifies_bert_on_m4_at_its_smallest_footprint():
    """bert/m4 at its smallest footprint, 2x (Fig. 3's tightest budget): HiGHS stays in the relaxation's root
    (1.1725 at 60 s); CP-SAT proves its optimum, 1.173671 plain steps, and its solution made into a schedule
    replays at that energy within both budgets: POET's optimum (NOTE 14)."""
    pytest.importorskip("ortools.sat.python.cp_model")
    graph = build_paper_graph("bert")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    budget = float(min_footprint_bytes(graph)[0])  # (benchmarks/bench_milp.py's budget at fraction 0)
    found = interval_bound_cpsat(graph, costs, MilpOptions(budget, 2.0), time_limit_s=240)
    assert found.optimal
    plain = costs.plain_step_energy_j
    assert found.bound_j / plain == pytest.approx(1.173671, abs=2e-6)
    replay = simulate(found.schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=2.0 * costs.plain_step_runtime_s, fixed_bytes=graph.reserved_bytes)
    assert replay.energy_j <= found.bound_j * (1 + 1e-6)

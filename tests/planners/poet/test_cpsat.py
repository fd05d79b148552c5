"""CP-SAT as a backend for the interval relaxation (docs/solve.md, NOTE 14), in its worker process, with the real solver
where OR-Tools is installed (skipped otherwise): its bound never above the exact optimum of the problem it was given
(costs and the runtime row rounded only ever downwards), between HiGHS's proven bound and its incumbent where both
prove the relaxation's optimum, the same in a process that has solved with highspy in-process, and on bert/m4 at its
smallest footprint (slow) the relaxation's optimum, which a schedule meets. A worker without OR-Tools answers so in
one line; a worker that dies is an error with its stderr's last line."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import simulate
from poetlab.planners.poet.backends import run_milp
from poetlab.errors import PoetlabError
from poetlab.planners.poet import cpsat
from poetlab.planners.poet.cpsat import cpsat_available, interval_bound_cpsat, solve_cpsat
from poetlab.planners.poet.intervals import interval_bound
from poetlab.planners.poet.milp import MilpOptions, build_milp

from bound_cases import GRAPHS, LEVERS, QUICK, setup
from dead_workers import DEAD_WORKERS


def _needs_ortools() -> None:
    available, why = cpsat_available()
    if not available:
        pytest.skip(why)


def test_a_worker_without_ortools_answers_so():
    """The real worker without site-packages (``-S``): one 'unavailable' answer naming the missing module, which
    ``solve_cpsat`` turns into CpsatUnavailableError ("pip install ortools") and ``solve`` into a skipped step."""
    request = pickle.dumps({"probe": True, "path": []})
    done = subprocess.run([sys.executable, "-I", "-S", str(cpsat.WORKER_PATH), str(os.getpid())], input=request, capture_output=True, timeout=60)
    (size,) = struct.unpack("<Q", done.stdout[:8])
    status = pickle.loads(done.stdout[8 : 8 + size])[1]
    assert status.startswith("error: unavailable") and "ortools" in status


@pytest.mark.parametrize("script,last_line", DEAD_WORKERS)
def test_a_worker_that_dies_is_an_error_with_its_last_line(tmp_path, monkeypatch, script, last_line):
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    monkeypatch.setattr(cpsat, "WORKER_PATH", worker)
    with pytest.raises(PoetlabError, match=f"CP-SAT worker exited .* without an answer: {last_line}"):
        solve_cpsat(np.ones(1), sp.csr_matrix(np.ones((1, 1))), np.ones(1), np.ones(1), np.zeros(1), np.ones(1), time_limit_s=30)


def test_cpsat_runs_beside_highspy_and_stops_at_its_target():
    """After a HiGHS solve in this process (highspy loaded, whose HiGHS clashes with OR-Tools'), CP-SAT still runs in
    its worker; given the relaxation's optimum as a hint and a target below it, it stops once its bound reaches the
    target, a bound never above the optimum."""
    _needs_ortools()
    graph = GRAPHS["linear"]()
    costs, peak, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=int(footprint + 0.05 * (peak - footprint)), runtime_budget_factor=1.2)
    highs = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    assert highs.optimal and highs.bound_j > costs.plain_step_energy_j
    warm = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, start=highs.schedule, target_j=highs.bound_j * 2)  # (highspy in-process)
    assert "highspy" in sys.modules and warm.bound_j > 0
    target = highs.bound_j * (1 - 1e-3)
    found = interval_bound_cpsat(graph, costs, options, time_limit_s=60, start=highs.schedule, target_j=target)
    assert target * (1 - 1e-9) <= found.bound_j <= highs.incumbent * costs.plain_step_energy_j * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_rounded_costs_and_a_fractional_row_only_lower_the_bound(seed):
    """A covering problem with fractional costs, integral rows and one fractional budget row (like POET's runtime
    row): CP-SAT's proven bound is never above the exact optimum (scipy's HiGHS at a gap of 0), and within the
    rounding of it."""
    _needs_ortools()
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
    _needs_ortools()
    A = sp.csr_matrix(np.vstack([np.eye(3), np.full(3, 0.1)]))
    found = solve_cpsat(np.array([0.3, 0.7, 0.11]), A, np.append(np.ones(3), -np.inf), np.append(np.full(3, np.inf), 0.3), np.zeros(3), np.ones(3), time_limit_s=5, mip_gap=0)
    assert found.status == "optimal" and found.objective == pytest.approx(1.11)
    assert 1.11 - 1e-8 <= found.bound <= 1.11


@pytest.mark.parametrize("model,platform,fraction,levers", QUICK)
def test_cpsat_proves_what_highs_proves_and_never_above_the_optimum(model, platform, fraction, levers):
    _needs_ortools()
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
    _needs_ortools()
    graph = build_paper_graph("bert")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    budget = float(min_footprint_bytes(graph)[0])  # (benchmarks/bench_milp.py's budget at fraction 0)
    found = interval_bound_cpsat(graph, costs, MilpOptions(budget, 2.0), time_limit_s=240)
    assert found.optimal
    plain = costs.plain_step_energy_j
    assert found.bound_j / plain == pytest.approx(1.173671, abs=2e-6)
    replay = simulate(found.schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=2.0 * costs.plain_step_runtime_s, fixed_bytes=graph.reserved_bytes)
    assert replay.energy_j <= found.bound_j * (1 + 1e-6)

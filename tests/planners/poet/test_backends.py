"""The MILP backends (HiGHS in a worker process, Gurobi where licensed): they agree, choose, stop and fail as
documented."""

from __future__ import annotations

import logging

import pytest

from poetlab.core.graph import min_footprint_bytes
from poetlab.errors import PoetlabError
from poetlab.planners.poet import backends
from poetlab.planners.poet.backends import GUROBI_SIZE_LIMIT, SolverUnavailableError, choose_solver, gurobi_license, run_milp
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.planners.poet.solver import solve

from dead_workers import DEAD_WORKERS
from small_graphs import mlp, residual
from solve_checks import replays as _replays, setup as _setup


# ---- backends ---------------------------------------------------------------------------------
gurobi_kind, _ = gurobi_license()


@pytest.mark.skipif(gurobi_kind == "none", reason="gurobipy or its license is not available")
@pytest.mark.parametrize("graph_factory", [mlp, residual])
def test_gurobi_and_highs_agree_on_tiny_graphs(graph_factory):
    graph, costs, peak = _setup(graph_factory(), "m0")
    footprint, _ = min_footprint_bytes(graph)
    budget = max(footprint, int(0.7 * peak))
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.5))
    assert model.n_cols <= GUROBI_SIZE_LIMIT and model.n_rows <= GUROBI_SIZE_LIMIT
    highs, gurobi = (run_milp(model, solver=name, mip_gap=0, threads=1) for name in ("highs", "gurobi"))
    assert highs.solver == "highs" and gurobi.solver == "gurobi"
    assert highs.status == gurobi.status == "optimal"
    assert highs.objective == pytest.approx(gurobi.objective, rel=1e-6)
    assert highs.objective > costs.plain_step_energy_j  # checkpoint-all does not fit this budget
    for name in ("highs", "gurobi"):
        result = solve(graph, costs, budget, 1.5, solver=name, mip_gap=0)
        assert result.status == "optimal" and result.energy_j == pytest.approx(highs.objective, rel=1e-6)
        _replays(result, graph, costs)


def test_auto_falls_back_to_highs_on_a_real_instance(caplog):
    graph, costs, peak = _setup("resnet18_cifar", "a72")
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak / 2))
    with caplog.at_level(logging.INFO, logger="poetlab.solvers"):
        chosen = choose_solver(model, "auto")
    if gurobi_kind == "full":
        assert chosen == "gurobi"
    else:
        assert chosen == "highs"
        assert any("using HiGHS" in r.message and ("size-limited" in r.message or "license" in r.message or "not installed" in r.message) for r in caplog.records)
        with pytest.raises(SolverUnavailableError, match="use --solver highs"):
            choose_solver(model, "gurobi")


def test_worker_ignores_the_current_directory(tmp_path, monkeypatch):
    """The worker starts isolated: a ``highspy`` or ``poetlab`` in the working directory is not run."""
    (tmp_path / "highspy.py").write_text("raise SystemExit('the working directory was imported')\n")
    (tmp_path / "poetlab").mkdir()
    (tmp_path / "poetlab" / "__init__.py").write_text("raise SystemExit('the working directory was imported')\n")
    graph, costs, peak = _setup("linear", "m0")
    monkeypatch.chdir(tmp_path)
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak // 2, runtime_budget_factor=2.0))
    answer = run_milp(model, solver="highs", threads=1)
    assert answer.status == "optimal" and answer.solver == "highs" and answer.objective > costs.plain_step_energy_j


@pytest.mark.parametrize("script,last_line", DEAD_WORKERS)
def test_a_worker_that_dies_is_an_error_not_a_time_limit(tmp_path, monkeypatch, script, last_line):
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    monkeypatch.setattr(backends, "WORKER_PATH", worker)
    graph, costs, peak = _setup("linear", "m0")
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak // 2, runtime_budget_factor=2.0))
    with pytest.raises(PoetlabError, match=f"without an answer: {last_line}"):
        run_milp(model, solver="highs", time_limit_s=30)


def test_a_solution_within_the_gap_of_a_known_bound_ends_the_solve_as_optimal():
    """The caller's lower bound (here the optimum itself) stops HiGHS at the first incumbent within the
    gap, and the answer is optimal with that bound, not a time limit."""
    graph, costs, _ = _setup("linear", "m4")
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=3800, runtime_budget_factor=1.2))
    exact = run_milp(model, solver="highs", mip_gap=1e-6, threads=1)
    assert exact.status == "optimal"
    known = run_milp(model, solver="highs", mip_gap=1e-3, threads=1, start=exact.x, lower_bound=exact.objective * (1 - 5e-4))
    assert known.status == "optimal" and known.bound == pytest.approx(exact.objective * (1 - 5e-4), rel=1e-12)
    assert known.gap <= 1e-3 and known.objective == pytest.approx(exact.objective, rel=1e-9)

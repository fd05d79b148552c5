"""The stage relaxation against exact optima: every schedule of POET's MILP is one of its points at no
higher cost, so its bound never exceeds the optimum, and its solutions replay as schedules."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.planners.poet.relaxation import build_relaxation, relaxation_point, stage_relaxation
from poetlab.planners.poet.solver import solve

from small_graphs import convnet, residual

LEVERS = [{}, {"paging": False}, {"remat": False}, {"count_paging_time": True, "charge_pagein": True}, {"params_in_budget": True}]
LEVER_IDS = ["poet", "remat-only", "paging-only", "fixes", "params-in-budget"]


def _instance(model, platform, fraction, levers):
    graph = {"residual": residual, "convnet": convnet}.get(model, lambda: build_paper_graph(model))()
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    budget = int(footprint + fraction * (peak - footprint)) + (2 * graph.param_bytes if levers.get("params_in_budget") else 0)
    return graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.5, **levers)


@pytest.mark.parametrize("model,platform", [("linear", "m4"), ("residual", "m0"), ("convnet", "m4")])
@pytest.mark.parametrize("fraction", [0.1, 0.5])
@pytest.mark.parametrize("levers", LEVERS, ids=LEVER_IDS)
def test_the_exact_optimum_is_a_point_of_the_relaxation_and_bounds_it(model, platform, fraction, levers):
    graph, costs, options = _instance(model, platform, fraction, levers)
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1)
    relaxed = stage_relaxation(graph, costs, options, time_limit_s=120, mip_gap=1e-7)
    assert relaxed.bound_j >= costs.plain_step_energy_j
    if exact.status != "optimal":
        assert exact.status == "infeasible"
        return
    assert relaxed.optimal
    assert relaxed.bound_j <= exact.objective * (1 + 1e-7)
    # the optimum's schedule satisfies every row of the relaxation, at no more than its energy
    c, A, lower, upper, col_upper, index = build_relaxation(graph, costs, options)
    x = relaxation_point(graph, build_milp(graph, costs, options).decode(exact.x), index)
    activity = A @ x
    assert np.all(activity >= lower - 1e-6) and np.all(activity <= upper + 1e-6)
    assert np.all(x <= col_upper)
    assert costs.plain_step_energy_j * (1 + c @ x) <= exact.objective * (1 + 1e-9)


@pytest.mark.parametrize("model,fraction,factor", [("resnet18_cifar", 0.2, 1.2), ("vgg16_cifar", 0.1, 1.05)])
def test_paper_schedules_are_points_of_the_relaxation_at_their_energy(model, fraction, factor):
    """The quick starts of two m4 instances (greedy, DTR, Capuchin, covers): each is a point of the
    relaxation whose objective is its simulated energy."""
    from poetlab.planners.poet.starts import best_start

    graph, costs, options = _instance(model, "m4", fraction, {})
    options = MilpOptions(options.ram_budget_bytes, factor)
    runtime_s = factor * costs.plain_step_runtime_s
    schedule, sim = best_start(graph, costs, options, runtime_s, lambda s: simulate(s, graph, costs, ram_budget_bytes=options.ram_budget_bytes, runtime_budget_s=runtime_s))
    c, A, lower, upper, _, index = build_relaxation(graph, costs, options)
    x = relaxation_point(graph, schedule.matrices().as_dict(), index)
    activity = A @ x
    assert np.all(activity >= lower - 1e-6) and np.all(activity <= upper + 1e-6)
    assert costs.plain_step_energy_j * (1 + c @ x) == pytest.approx(sim.energy_j, rel=1e-9)


def test_the_relaxation_certifies_vgg16_cifar_on_m4_at_ten_percent():
    """vgg16_cifar on m4, 10% of the way from the footprint to checkpoint-all, 1.05x: the eviction bound
    (1.00193 plain steps) leaves a 0.18% gap to every quick start; the relaxation is solved to its
    optimum and its solution replays within the budgets at that energy, so POET is certified."""
    graph, costs, options = _instance("vgg16_cifar", "m4", 0.1, {})
    options = MilpOptions(options.ram_budget_bytes, 1.05)
    relaxed = stage_relaxation(graph, costs, options, time_limit_s=120, mip_gap=1e-6)
    assert relaxed.optimal
    sim = simulate(relaxed.schedule, graph, costs, ram_budget_bytes=options.ram_budget_bytes, runtime_budget_s=1.05 * costs.plain_step_runtime_s)
    assert sim.energy_j <= relaxed.bound_j * (1 + 1e-5)
    result = solve(graph, costs, options.ram_budget_bytes, 1.05, time_limit_s=150, mip_gap=1e-3, threads=1)  # (10-30 s; generous for a loaded machine)
    assert result.status == "optimal" and result.solver == "bound"
    assert result.energy_j <= result.bound_j * (1 + 1e-3)

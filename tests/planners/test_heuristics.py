"""The greedy schedules (the MILP's quick starts and the paging/remat baselines): each replays in the
simulator within its budget and is a feasible point of the MILP."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule, minimal_recompute
from poetlab.planners.poet.milp import MilpOptions, build_milp

from milp_checks import feasible


@pytest.mark.parametrize("model_name,platform,fraction", [("linear", "m0", 0.6), ("resnet18_cifar", "a72", 0.6), ("vgg16_cifar", "m4", 0.7)])
@pytest.mark.parametrize("prefetch", [False, True])
def test_greedy_paging_schedule_replays_and_encodes(model_name, platform, fraction, prefetch):
    graph = build_paper_graph(model_name)
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    budget = int(fraction * peak)
    schedule = greedy_paging_schedule(graph, costs, budget, prefetch=prefetch)
    assert schedule is not None
    sim = simulate(schedule, graph, costs, ram_budget_bytes=budget)
    assert sim.n_recomputes == 0 and sim.n_pageouts > 0 and sim.n_pageins >= sim.n_pageouts
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.0, charge_pagein=prefetch))
    x = model.encode(schedule.matrices().as_dict())
    ok, bad_rows = feasible(model, x)
    assert ok, f"rows violated: {bad_rows[:5]}"
    assert model.c @ x == pytest.approx(sim.energy_j, rel=1e-9)
    decoded = model.decode(x)
    assert np.array_equal(decoded["R"], schedule.matrices().R[: graph.n_nodes])


def test_greedy_paging_gives_up_below_the_footprint():
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("m0"))
    footprint, _ = min_footprint_bytes(graph)
    assert greedy_paging_schedule(graph, costs, footprint - 1) is None


@pytest.mark.parametrize("model_name,platform,fraction", [("linear", "m0", 0.5), ("resnet18_cifar", "a72", 0.6), ("vgg16_cifar", "a72", 0.6)])
def test_greedy_remat_schedule_replays_and_encodes(model_name, platform, fraction):
    graph = build_paper_graph(model_name)
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    budget = int(fraction * peak)
    runtime_budget_s = 2.0 * costs.plain_step_runtime_s
    schedule = greedy_remat_schedule(graph, costs, budget, runtime_budget_s)
    assert schedule is not None
    sim = simulate(schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=runtime_budget_s)
    assert sim.n_pageouts == 0 and sim.n_recomputes > 0
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=2.0, paging=False))
    x = model.encode(schedule.matrices().as_dict())
    ok, bad_rows = feasible(model, x)
    assert ok, f"rows violated: {bad_rows[:5]}"
    assert model.c @ x == pytest.approx(sim.energy_j, rel=1e-9)
    # a runtime budget the recomputations cannot meet
    assert greedy_remat_schedule(graph, costs, budget, costs.plain_step_runtime_s) is None


def test_minimal_recompute_fills_what_is_not_kept():
    graph = build_paper_graph("linear")
    T = graph.n_nodes
    nothing_kept = np.zeros((T, T), dtype=bool)
    R = minimal_recompute(graph, nothing_kept)
    # with nothing kept, every stage recomputes all the ancestors of its node
    for t in range(T):
        ancestors = {t}
        for i in range(t, -1, -1):
            if i in ancestors:
                ancestors.update(graph.nodes[i].inputs)
        assert set(np.flatnonzero(R[t])) == ancestors

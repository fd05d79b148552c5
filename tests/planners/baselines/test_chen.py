"""Baselines on the one simulator: never better than the MILP's optimum, Chen's memory is O(sqrt n)."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate, solve
from poetlab.planners.baselines import BASELINES, Budgets, run_baseline
from poetlab.planners.baselines.chen import articulation_points, plan_sqrtn_linearized
from poetlab.errors import UnknownNameError
from poetlab.core.graph import min_footprint_bytes

from small_graphs import mlp, relu_chain as chain, residual




def test_chen_sqrtn_memory_grows_as_sqrt_n_on_chains():
    peaks, all_peaks = [], []
    for n in (16, 64, 256):
        graph = chain(n)
        costs = CostModel.from_flops(graph, load_platform("a72"))
        schedule = plan_sqrtn_linearized(graph, costs, Budgets(1e12))
        sim = simulate(schedule, graph, costs)
        # every forward node is computed at most twice: Chen recomputes each segment once
        assert schedule.matrices().R.sum(axis=0).max() <= 2
        assert 0 < sim.n_recomputes < len(graph.forward_indices)
        peaks.append(sim.peak_ram_bytes)
        all_peaks.append(simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes)
    for small, large in zip(peaks, peaks[1:]):
        assert large / small < 2.5  # 4x the length, about 2x the memory
    for small, large in zip(all_peaks, all_peaks[1:]):
        assert large / small > 3.5  # checkpoint-all: linear


def test_articulation_points():
    assert articulation_points(chain(5)) == list(chain(5).forward_indices)
    graph = residual()
    points = articulation_points(graph)
    # 0 input, 1 conv, 2 relu, 3 conv, 4 add(relu, conv), 5 flatten, 6 loss: only the second conv is
    # bypassed (by the add reading the relu), so every other node cuts input from loss
    assert points == [0, 1, 2, 4, 5, 6]


@pytest.mark.parametrize("graph_factory,platform", [(mlp, "m0"), (residual, "a72"), (lambda: build_paper_graph("linear"), "m0")])
def test_no_baseline_beats_the_milp_optimum(graph_factory, platform):
    graph = graph_factory()
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    for fraction in (1.0, 0.5):
        budgets = Budgets(int(footprint + fraction * (peak - footprint)), 3.0)
        optimum = solve(graph, costs, budgets.ram_bytes, budgets.runtime_factor, mip_gap=0)
        assert optimum.status == "optimal"
        feasible = 0
        for method in BASELINES:
            result = run_baseline(method, graph, costs, budgets)
            assert "\n" not in result.reason
            if result.feasible:
                feasible += 1
                assert result.energy_j >= optimum.energy_j * (1 - 1e-9), method
                assert result.simulation.peak_ram_bytes <= budgets.ram_bytes
            else:
                assert result.reason and result.simulation is None
        assert feasible >= 1
        if fraction == 1.0:  # at its own peak checkpoint-all fits, and is optimal (the lower bound)
            reference = run_baseline("checkpoint_all", graph, costs, budgets)
            assert reference.feasible and reference.energy_j == pytest.approx(optimum.energy_j, rel=1e-9)


def test_methods_say_why_they_cannot_meet_a_budget():
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("m0"))
    budgets = Budgets(1000, 2.0)  # below the smallest single-node footprint
    for method in BASELINES:
        result = run_baseline(method, graph, costs, budgets)
        assert not result.feasible
        assert len(result.reason.splitlines()) == 1 and result.reason
    with pytest.raises(UnknownNameError, match="valid baselines"):
        run_baseline("bogus", graph, costs, budgets)


def test_milp_variants_use_only_their_lever():
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("m0"))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    budgets = Budgets(int(0.6 * peak), 2.0)
    checkmate = run_baseline("checkmate", graph, costs, budgets)
    paging = run_baseline("paging_only", graph, costs, budgets)
    assert checkmate.feasible and paging.feasible
    assert checkmate.simulation.n_pageouts == 0 and checkmate.simulation.n_recomputes > 0
    assert paging.simulation.n_recomputes == 0 and paging.simulation.n_pageouts > 0
    assert np.isfinite(checkmate.energy_j) and np.isfinite(paging.energy_j)

"""Chen's sqrt(n) checkpointing: memory O(sqrt n) on chains, articulation points of branchy graphs."""

from __future__ import annotations


from poetlab import CostModel, checkpoint_all_schedule, load_platform, simulate
from poetlab.planners.baselines import Budgets
from poetlab.planners.baselines.chen import articulation_points, plan_sqrtn_linearized

from small_graphs import relu_chain as chain, residual


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

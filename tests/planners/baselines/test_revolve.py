"""Revolve (Griewank's binomial checkpointing): binomial counts on chains, the most slots that fit, graphs
linearised into chains of blocks."""

from __future__ import annotations

import math
from functools import lru_cache

import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind
from poetlab.planners.baselines import revolve
from poetlab.planners.baselines.base import Budgets, CannotMeetBudget
from poetlab.planners.baselines.revolve import block_chain, revolve_forward_count, revolve_schedule

from small_graphs import relu_chain as chain
from small_graphs import residual


def _costs(graph: TrainingGraph, platform: str) -> CostModel:
    return CostModel.from_flops(graph, load_platform(platform))


def _peak(graph: TrainingGraph, costs: CostModel) -> int:
    return simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes


# ---- revolve ------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _forward_steps_by_recursion(l: int, c: int) -> float:
    """Advance m, checkpoint, reverse the right part with a slot fewer, then the left part with all."""
    if l == 1:
        return 0
    if c == 0:
        return math.inf
    return min(m + _forward_steps_by_recursion(l - m, c - 1) + _forward_steps_by_recursion(m, c) for m in range(1, l))


def test_binomial_formula_is_the_optimal_recursion():
    for l in range(1, 41):
        for c in range(1, 7):
            assert revolve_forward_count(l, c) == _forward_steps_by_recursion(l, c), (l, c)
    assert revolve_forward_count(10, 1) == 45  # one slot: sweep l-1, l-2, ... steps
    assert revolve_forward_count(10, 3) == 15  # t = 2: 2 * 10 - C(5, 4)
    assert revolve_forward_count(10, 9) == 9  # enough slots: only the initial sweep


@pytest.mark.parametrize("n", [3, 7, 12])
def test_revolve_recomputes_what_the_binomial_formula_says(n):
    graph = chain(n)
    costs = _costs(graph, "a72")
    steps = block_chain(graph).n_steps
    assert steps == n + 1
    forward = set(graph.forward_indices)
    for slots in range(1, steps + 1):
        schedule = revolve_schedule(graph, slots)
        sim = simulate(schedule, graph, costs)
        forward_computes = sum(1 for op in schedule.ops if op.kind is OpKind.COMPUTE and op.node in forward)
        advances = revolve_forward_count(steps, slots)
        # the input once, every advance, and the loss computed by the first turn
        assert forward_computes == 1 + advances + 1, slots
        assert sim.n_recomputes == advances - (steps - 1), slots
        assert sim.n_pageouts == 0
        schedule.matrices()  # stages fit the MILP's matrix view


def test_revolve_with_enough_slots_is_checkpoint_all():
    graph = chain(9)
    costs = _costs(graph, "m0")
    steps = block_chain(graph).n_steps
    reference = simulate(checkpoint_all_schedule(graph), graph, costs)
    for slots in (steps - 1, steps, steps + 5):
        sim = simulate(revolve_schedule(graph, slots), graph, costs)
        assert sim.n_recomputes == 0
        assert sim.energy_j == pytest.approx(reference.energy_j, rel=1e-12)
    planned = revolve.plan(graph, costs, Budgets(reference.peak_ram_bytes))
    assert simulate(planned, graph, costs).energy_j == pytest.approx(reference.energy_j, rel=1e-12)


def test_revolve_takes_the_most_slots_that_fit():
    graph = chain(12)
    costs = _costs(graph, "a72")
    budget = 600
    planned = revolve.plan(graph, costs, Budgets(budget))
    peaks = {c: simulate(revolve_schedule(graph, c), graph, costs).peak_ram_bytes for c in range(1, 14)}
    chosen = max(c for c, peak in peaks.items() if peak <= budget)
    assert planned == revolve_schedule(graph, chosen)
    assert 1 < chosen < 13 and peaks[chosen + 1] > budget
    assert simulate(planned, graph, costs).n_recomputes == revolve_forward_count(13, chosen) - 12


def test_revolve_says_when_the_runtime_budget_is_what_fails():
    graph = build_paper_graph("resnet18_cifar")
    costs = _costs(graph, "a72")
    budget = 0.6 * _peak(graph, costs)
    assert simulate(revolve.plan(graph, costs, Budgets(budget)), graph, costs, ram_budget_bytes=budget).n_recomputes > 0
    with pytest.raises(CannotMeetBudget, match=r"^revolve: .*runtime budget") as info:
        revolve.plan(graph, costs, Budgets(budget, 1.05))
    assert "\n" not in str(info.value)


def test_residual_is_linearised_into_blocks():
    graph = residual()
    chain_ = block_chain(graph)
    # 0 input, 1 conv, 2 relu, 3 conv, 4 add(relu, conv), 5 flatten, 6 loss; the skip jumps over 3
    assert chain_.points == (0, 1, 2, 4, 5, 6)
    assert [step.nodes for step in chain_.steps] == [(1,), (2,), (3, 4), (5,), (6,)]
    assert chain_.step(3).interior == (3,)
    assert [step.backward for step in chain_.steps] == [(12,), (11,), (9, 10), (8,), (7,)]

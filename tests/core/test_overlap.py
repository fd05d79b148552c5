"""The two-stream timing of a schedule (core.overlap): a chain computed by hand, bounds on real planners'
schedules, memory held until a page-out ends, and POFO's and POET's schedules read both ways."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate, solve
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.overlap import overlapped_timing
from poetlab.core.schedule import InvalidScheduleError, Op, OpKind, Schedule
from poetlab.planners.baselines import pofo
from poetlab.planners.baselines.base import Budgets

from small_graphs import relu_chain

C, F, P, I = OpKind.COMPUTE, OpKind.FREE, OpKind.PAGE_OUT, OpKind.PAGE_IN


def _hand_costs(pageout_s: float, pagein_s: float) -> CostModel:
    """relu_chain(1) (input, relu, loss, relu's gradient, input's gradient) with runtimes 1..5 s and the
    relu's output paged at the given times."""
    zeros = np.zeros(5)
    pageout, pagein = zeros.copy(), zeros.copy()
    pageout[1], pagein[1] = pageout_s, pagein_s
    return CostModel("hand", np.arange(1.0, 6.0), np.ones(5), pagein, pageout, pagein / 10, pageout / 10)


def _ops(*rows: tuple[OpKind, int]) -> Schedule:
    return Schedule(5, tuple(Op(kind, node, stage) for stage, (kind, node) in enumerate(rows)))


# the relu's output (node 1) is paged out while the loss computes, freed, paged back for its gradient
PAGED = _ops((C, 0), (C, 1), (P, 1), (C, 2), (F, 1), (I, 1), (C, 3), (F, 2), (C, 4), (F, 0), (F, 1), (F, 3), (F, 4))


def test_a_chain_timed_by_hand():
    """Page-out 2.5 s, page-in 1.5 s. Input 0-1, relu 1-3; the page-out is issued after the relu, 3-5.5,
    beside the loss, 3-6; the free of the relu's output finds the page-out over (6); the page-in runs
    6-7.5, and the relu's gradient, which reads it, waits for it: 7.5-11.5; the input's gradient
    11.5-16.5. Serial: 15 s of compute plus 4 s of transfers."""
    graph = relu_chain(1)
    timing = overlapped_timing(PAGED, graph, _hand_costs(2.5, 1.5))
    assert timing.runtime_s == pytest.approx(16.5)
    assert timing.serial_runtime_s == pytest.approx(19.0)
    assert (timing.compute_s, timing.transfer_s, timing.hidden_s) == pytest.approx((15.0, 4.0, 2.5))


def test_memory_is_held_until_the_page_out_ends():
    """A 4 s page-out outlasts the loss (3-6): the free waits until 7 and the page-in runs 7-8.5, so
    the gradients run 8.5-12.5 and 12.5-17.5; the peak is the simulator's, as nothing after the free
    starts before it."""
    graph = relu_chain(1)
    costs = _hand_costs(4.0, 1.5)
    timing = overlapped_timing(PAGED, graph, costs)
    assert timing.runtime_s == pytest.approx(17.5)
    assert timing.serial_runtime_s == pytest.approx(20.5)
    assert simulate(PAGED, graph, costs).peak_ram_bytes == 4 * 64
    # freed only at the end (no page-in): the page-out hides behind the computations after it
    late_free = _ops((C, 0), (C, 1), (P, 1), (C, 2), (C, 3), (F, 2), (C, 4), (F, 0), (F, 1), (F, 3), (F, 4))
    timing = overlapped_timing(late_free, graph, costs)
    assert (timing.runtime_s, timing.hidden_s) == pytest.approx((15.0, 4.0))


def test_a_page_in_issued_earlier_hides_behind_computation():
    """On relu_chain(2) the first relu's output (node 1) is paged out and back; issued before the second
    relu's gradient rather than right before its reader, the page-in hides behind that gradient."""
    graph = relu_chain(2)  # input, relu, relu, loss, bwd relu2 (2,3), bwd relu1 (1,2,4), bwd input (0,1,5)
    n = graph.n_nodes
    runtime = np.full(n, 1.0)
    pageout, pagein = np.zeros(n), np.zeros(n)
    pageout[1], pagein[1] = 0.5, 1.0
    costs = CostModel("hand", runtime, runtime, pagein, pageout, pagein, pageout)
    head = [(C, 0), (C, 1), (C, 2), (P, 1), (C, 3), (F, 1)]
    tail = [(C, 5), (F, 2), (F, 3), (F, 4), (C, 6), (F, 0), (F, 1), (F, 5), (F, 6)]
    late = Schedule(n, tuple(Op(k, v, s) for s, (k, v) in enumerate([*head, (C, 4), (I, 1), *tail])))
    early = Schedule(n, tuple(Op(k, v, s) for s, (k, v) in enumerate([*head, (I, 1), (C, 4), *tail])))
    # late: 0-1, 1-2, 2-3, page-out 3-3.5 beside the loss 3-4, free at 4, gradient 4-5, page-in 5-6, 6-7, 7-8
    assert overlapped_timing(late, graph, costs).runtime_s == pytest.approx(8.0)
    # early: the page-in 4-5 runs beside the gradient 4-5: no transfer time left in the step
    assert overlapped_timing(early, graph, costs).runtime_s == pytest.approx(7.0)
    assert simulate(early, graph, costs).runtime_s == simulate(late, graph, costs).runtime_s == pytest.approx(8.5)


def test_an_invalid_schedule_is_refused_by_the_simulator():
    graph = relu_chain(1)
    reads_before_page_in = _ops((C, 0), (C, 1), (P, 1), (C, 2), (F, 1), (C, 3), (C, 4))
    with pytest.raises(InvalidScheduleError, match="not in RAM"):
        overlapped_timing(reads_before_page_in, graph, _hand_costs(1.0, 1.0))


def _check_bounds(schedule: Schedule, graph, costs) -> float:
    sim = simulate(schedule, graph, costs)
    timing = overlapped_timing(schedule, graph, costs)
    assert timing.serial_runtime_s == sim.runtime_s
    assert timing.compute_s + timing.transfer_s == pytest.approx(sim.runtime_s, rel=1e-12)
    assert timing.runtime_s <= sim.runtime_s * (1 + 1e-12)
    assert timing.runtime_s >= max(timing.compute_s, timing.transfer_s) * (1 - 1e-12)
    return timing.hidden_s


@pytest.mark.parametrize("platform, runtime_factor", [("m0", 1.0), ("m4", 1.0), ("jetsontx2", 1.01)])
def test_pofo_schedules_are_valid_and_within_the_bounds(platform, runtime_factor):
    """POFO as published on the paper's linear model at its smallest footprint, (almost) no time for recomputation: its schedule replays
    within the budget, pages, and under overlap hides part of its transfer time; checkpoint-all has no
    transfer, so its overlapped time is its serial time."""
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform(platform))
    footprint, _ = min_footprint_bytes(graph)
    result = pofo.solve_pofo(graph, costs, Budgets(footprint, runtime_factor), objective="time")
    assert simulate(result.schedule, graph, costs, ram_budget_bytes=footprint).peak_ram_bytes <= footprint
    assert result.simulation.n_pageouts > 0
    assert _check_bounds(result.schedule, graph, costs) > 0
    plain = checkpoint_all_schedule(graph)
    assert _check_bounds(plain, graph, costs) == 0.0


def test_poet_schedule_within_the_bounds():
    """POET's schedule at the smallest footprint of a chain on the M4, where paging is dear: read both ways."""
    graph = relu_chain(6)
    costs = CostModel.from_flops(graph, load_platform("m4"))
    footprint, _ = min_footprint_bytes(graph)
    result = solve(graph, costs, footprint + graph.reserved_bytes, None, time_limit_s=30)
    assert result.schedule is not None
    _check_bounds(result.schedule, graph, costs)

"""issue_for_overlap: page-ins issued earlier and page-outs' frees later, within the RAM budget, timed by
hand on a chain, and on real planners' schedules the same work at no more overlapped time."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform, simulate, solve
from poetlab.core.overlap import overlapped_timing
from poetlab.core.schedule import Op, OpKind, Schedule
from poetlab.planners.baselines import pofo
from poetlab.planners.baselines.base import Budgets
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.transfer_order import issue_for_overlap

from small_graphs import relu_chain

C, F, P, I = OpKind.COMPUTE, OpKind.FREE, OpKind.PAGE_OUT, OpKind.PAGE_IN
# relu_chain(2): input, relu, relu, loss, bwd relu2 (reads 2, 3), bwd relu1 (1, 2, 4), bwd input (0, 1, 5); 64 B each.
# The first relu's output (node 1) is paged out beside the loss, freed, and paged back in right before its reader.
LATE = [(C, 0), (C, 1), (C, 2), (P, 1), (C, 3), (F, 1), (C, 4), (I, 1), (C, 5), (F, 2), (F, 3), (F, 4), (C, 6), (F, 0), (F, 1), (F, 5), (F, 6)]


def _setup(pageout_s: float, pagein_s: float):
    graph = relu_chain(2)
    n = graph.n_nodes
    runtime, pageout, pagein = np.ones(n), np.zeros(n), np.zeros(n)
    pageout[1], pagein[1] = pageout_s, pagein_s
    costs = CostModel("hand", runtime, runtime, pagein, pageout, pagein, pageout)
    return graph, costs, Schedule(n, tuple(Op(kind, node, stage) for stage, (kind, node) in enumerate(LATE)))


def test_a_page_in_is_issued_before_the_computation_that_hides_it():
    """Page-out 0.5 s, page-in 1 s, every computation 1 s. As written the page-in (5-6) waits for the
    gradient before it, and its reader for the page-in: 8 s. Issued before that gradient it runs beside
    it (4-5): 7 s, all transfer time hidden; RAM during that gradient grows to 5 tensors, below the step's
    peak (6 tensors, during the next gradient)."""
    graph, costs, late = _setup(0.5, 1.0)
    peak = simulate(late, graph, costs).peak_ram_bytes
    assert peak == 6 * 64 and overlapped_timing(late, graph, costs).runtime_s == pytest.approx(8.0)
    plan = issue_for_overlap(late, graph, costs, peak)
    assert [(op.kind, op.node) for op in plan.schedule.ops[5:8]] == [(F, 1), (I, 1), (C, 4)]
    assert plan.timing.runtime_s == pytest.approx(7.0) and plan.simulation.peak_ram_bytes == peak
    assert plan.simulation.runtime_s == simulate(late, graph, costs).runtime_s == pytest.approx(8.5)
    # with less RAM than that gradient plus the tensor (the budget is the pass's, not the schedule's): nothing moves
    tight = issue_for_overlap(late, graph, costs, 4.5 * 64)
    assert tight.schedule.ops == late.ops and tight.timing.runtime_s == pytest.approx(8.0)


def test_a_free_waits_for_its_page_out_later_in_the_schedule():
    """Page-out 1.5 s outlasts the loss (3-4): as written the free holds the next gradient back until
    4.5, then the page-in 5.5-6.5 and the gradients until 8.5. Freed after that gradient instead
    (which does not read the tensor), the gradient runs 4-5 and the step ends at 8.0."""
    graph, costs, late = _setup(1.5, 1.0)
    peak = simulate(late, graph, costs).peak_ram_bytes
    assert overlapped_timing(late, graph, costs).runtime_s == pytest.approx(8.5)
    plan = issue_for_overlap(late, graph, costs, peak)
    assert [(op.kind, op.node) for op in plan.schedule.ops[5:8]] == [(C, 4), (F, 1), (I, 1)]
    assert plan.timing.runtime_s == pytest.approx(8.0) and plan.simulation.peak_ram_bytes == peak
    assert issue_for_overlap(late, graph, costs, 4.5 * 64).timing.runtime_s == pytest.approx(8.5)


def _same_work(plan, schedule, graph, costs, budget):
    sim = simulate(schedule, graph, costs)
    assert Counter((op.kind, op.node) for op in plan.schedule.ops) == Counter((op.kind, op.node) for op in schedule.ops)
    assert plan.simulation.energy_j == pytest.approx(sim.energy_j, rel=1e-12)
    assert plan.simulation.runtime_s == pytest.approx(sim.runtime_s, rel=1e-12)
    assert plan.simulation.peak_ram_bytes <= max(budget - graph.reserved_bytes, sim.peak_ram_bytes)
    simulate(plan.schedule, graph, costs, ram_budget_bytes=budget)  # valid within the budget
    assert plan.timing.runtime_s <= overlapped_timing(schedule, graph, costs).runtime_s * (1 + 1e-12)
    assert plan.timing.runtime_s >= max(plan.timing.compute_s, plan.timing.transfer_s) * (1 - 1e-12)


@pytest.mark.parametrize("platform, runtime_factor", [("m4", 1.0), ("jetsontx2", 1.01)])
def test_pofo_and_poet_schedules_reissued(platform, runtime_factor):
    """POFO as published and POET on the paper's linear model at its smallest footprint: reissued, the
    same operations and energy, within the budget, no slower under overlap; POFO's page-in, placed right
    before its reader, then hides behind computation."""
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform(platform))
    budget = budget_ladder(graph, costs, [0.0])[0]
    planned = pofo.solve_pofo(graph, costs, Budgets(budget, runtime_factor), objective="time").schedule
    plan = issue_for_overlap(planned, graph, costs, budget)
    _same_work(plan, planned, graph, costs, budget)
    assert plan.timing.runtime_s < overlapped_timing(planned, graph, costs).runtime_s
    poet = solve(graph, costs, budget, runtime_factor, time_limit_s=20).schedule
    _same_work(issue_for_overlap(poet, graph, costs, budget), poet, graph, costs, budget)


@pytest.mark.parametrize("platform", ["m4", "jetsontx2"])
def test_every_baseline_schedule_reissued_within_the_bounds(platform):
    """Every planner that pages or recomputes, on the paper's linear model at three budgets: both timings
    within their bounds (the overlapped time between either stream's total and the serial time), and
    the reissued schedule the same work within the budget, no slower."""
    from poetlab.planners.baselines import BASELINES, PlanOptions, run_baseline

    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform(platform))
    paged = 0
    for budget in budget_ladder(graph, costs, [0.5, 0.2, 0.0]):
        for method in BASELINES:
            planned = run_baseline(method, graph, costs, Budgets(budget, 1.2), PlanOptions(time_limit_s=5, threads=1))
            if not planned.feasible:
                continue
            plan = issue_for_overlap(planned.schedule, graph, costs, budget)
            _same_work(plan, planned.schedule, graph, costs, budget)
            paged += planned.simulation.n_pageins > 0
    assert paged >= 3  # the bounds were checked on schedules that move data, not only on remat ones


def test_a_page_in_stops_where_the_ram_before_a_free_is_full():
    """relu_chain(3) (input 0, relus 1-3, loss 4, gradients 5-8; 64 B, 1 s each) in 320 bytes, the input
    paged out after it is computed and back in right before its gradient (8), 1.2 s each way. Moved back
    past relu 1's gradient (7: 1 s, not enough), the page-in would pass the frees of the loss and relu 3's
    gradient (3, 5) and land right after relu 2's gradient (6), when relus 1-3 and the gradients 5 and 6
    fill the 320 bytes; it stops after the first of those frees instead (four tensors in RAM), 7-8.2 s
    beside gradient 7: 9.2 s."""
    graph = relu_chain(3)
    n = graph.n_nodes
    ones, page = np.ones(n), np.full(n, 1.2)
    costs = CostModel("hand", ones, ones, page, page, page, page)
    rows = [(C, 0), (P, 0), (C, 1), (F, 0), (C, 2), (C, 3), (C, 4), (C, 5), (F, 4), (C, 6), (F, 3), (F, 5), (C, 7), (F, 2), (F, 6),
            (I, 0), (C, 8), (F, 0), (F, 1), (F, 7), (F, 8)]
    schedule = Schedule(n, tuple(Op(kind, node, stage) for stage, (kind, node) in enumerate(rows)))
    plan = issue_for_overlap(schedule, graph, costs, 320)
    order = [(op.kind, op.node) for op in plan.schedule.ops]
    assert order[order.index((I, 0)) - 1 : order.index((I, 0)) + 3] == [(F, 3), (I, 0), (F, 5), (C, 7)]
    assert plan.timing.runtime_s == pytest.approx(9.2) and plan.simulation.peak_ram_bytes == 320

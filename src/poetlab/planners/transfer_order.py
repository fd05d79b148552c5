"""Issue a schedule's page transfers for a transfer stream beside the computations (the timing model of
:mod:`poetlab.core.overlap`, POFO's): the same operations, with each page-in moved earlier and each free
that follows a page-out moved later, so that the transfer runs while computations go on.

A planner that assumes one stream (the POET MILP, the kit's chain DPs) places a page-in right before the
stage that reads it and frees a paged-out tensor as soon as it may, which is what the serial model
prices; under overlap the computation that reads the tensor then waits for the whole page-in, and the
free waits for the whole page-out. POFO prefetches ahead and keeps an offloaded tensor until its
transfer ends. :func:`issue_for_overlap` does that for any schedule: each page-in goes back (each free
forward) past just enough computation to cover the transfers in between, never past an operation on the
same tensor, and only while the RAM budget holds with the tensor still in RAM there. A move is kept only if
the overlapped time does not grow. Energy, the computations and the serial time are unchanged; the peak
can grow up to the budget (what memory overlap costs), which the result's simulation reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.overlap import OverlapTiming, overlapped_timing
from poetlab.core.schedule import Op, OpKind, Schedule, SimulationResult, simulate


@dataclass(frozen=True)
class OverlapPlan:
    """A schedule reissued for overlap, its simulation (the peak with the moved transfers) and its timing."""

    schedule: Schedule
    simulation: SimulationResult
    timing: OverlapTiming


def issue_for_overlap(schedule: Schedule, graph: TrainingGraph, costs: CostModel, ram_budget_bytes: float) -> OverlapPlan:
    """``schedule`` with its page-ins issued earlier and its page-outs' frees later (see the module's
    docstring), within ``ram_budget_bytes`` less the bytes ``solve`` keeps free (``graph.reserved_bytes``)."""
    limit = float(ram_budget_bytes) - graph.reserved_bytes
    items = list(enumerate(schedule.ops))  # (identity, op): a move keeps an op's identity
    sim = simulate(schedule, graph, costs)
    timing = overlapped_timing(schedule, graph, costs, sim)
    targets = [uid for index, (uid, op) in enumerate(items)
               if op.kind is OpKind.PAGE_IN or (op.kind is OpKind.FREE and _follows_page_out(items, index))]
    for uid in targets:
        index = next(position for position, (other, _) in enumerate(items) if other == uid)
        moved = _moved(items, index, graph, costs, sim.memory_trace_bytes, limit)
        if moved is None:
            continue
        candidate = Schedule(schedule.n_nodes, tuple(op for _, op in moved), schedule.graph_fingerprint)
        candidate_sim = simulate(candidate, graph, costs)
        candidate_timing = overlapped_timing(candidate, graph, costs, candidate_sim)
        if candidate_sim.peak_ram_bytes <= max(limit, sim.peak_ram_bytes) and candidate_timing.runtime_s <= timing.runtime_s:
            items, sim, timing = moved, candidate_sim, candidate_timing
    return OverlapPlan(Schedule(schedule.n_nodes, tuple(op for _, op in items), schedule.graph_fingerprint), sim, timing)


def _follows_page_out(items: list[tuple[int, Op]], index: int) -> bool:
    """Whether the free at ``index`` is of a tensor paged out since it was last created."""
    node = items[index][1].node
    for _, op in reversed(items[:index]):
        if op.node == node:
            if op.kind is OpKind.PAGE_OUT:
                return True
            if op.kind in (OpKind.COMPUTE, OpKind.PAGE_IN, OpKind.DECOMPRESS):
                return False
    return False


def _busy(op: Op, costs: CostModel) -> tuple[float, float]:
    """(compute seconds, transfer seconds) of ``op``, a first computation's time for any computation (an
    estimate of how far to move, which the overlapped timing then checks)."""
    if op.kind is OpKind.COMPUTE:
        return float(costs.runtime_s[op.node]), 0.0
    if op.kind is OpKind.PAGE_IN:
        return 0.0, float(costs.pagein_time_s[op.node])
    if op.kind is OpKind.PAGE_OUT:
        return 0.0, float(costs.pageout_time_s[op.node])
    return 0.0, 0.0


def _moved(items: list[tuple[int, Op]], index: int, graph: TrainingGraph, costs: CostModel, trace: np.ndarray, limit: float) -> list[tuple[int, Op]] | None:
    """``items`` with the page-in at ``index`` moved earlier, or the free at ``index`` later, past
    computations whose time covers its transfer and the transfers passed on the way; None if it cannot
    move. ``trace``: the RAM in use after each op, which gains the tensor's bytes wherever it is passed."""
    op = items[index][1]
    node, nbytes = op.node, int(graph.output_bytes[op.node])
    backward = op.kind is OpKind.PAGE_IN
    own = _busy(op, costs)[1] if backward else 0.0
    covered = waiting = 0.0
    if backward:  # computations already between the page-in and its first reader
        later = (other for _, other in items[index + 1 :])
        for other in later:
            if other.kind is OpKind.COMPUTE and node in graph.nodes[other.node].inputs:
                break
            compute, transfer = _busy(other, costs)
            covered, waiting = covered + compute, waiting + transfer
        steps = range(index - 1, -1, -1)
    else:  # computations already between the page-out and the free
        for _, other in reversed(items[:index]):
            if other.node == node and other.kind is OpKind.PAGE_OUT:
                own = _busy(other, costs)[1]
                break
            compute, transfer = _busy(other, costs)
            covered, waiting = covered + compute, waiting + transfer
        steps = range(index + 1, len(items))
    best = None
    for position in steps:
        other = items[position][1]
        # a page-in placed before this op is in RAM from the state before it (after the op before it) on
        in_use = max(trace[position], trace[position - 1]) if backward and position > 0 else trace[position]
        if other.node == node or covered >= own + waiting or in_use + nbytes > limit:
            break
        compute, transfer = _busy(other, costs)
        covered, waiting = covered + compute, waiting + transfer
        best = position
    if best is None:
        return None
    rest = items[:index] + items[index + 1 :]
    if backward:
        stage = items[best - 1][1].stage if best > 0 else items[best][1].stage
        return rest[:best] + [(items[index][0], Op(op.kind, node, stage))] + rest[best:]
    stage = items[best][1].stage
    return rest[:best] + [(items[index][0], Op(op.kind, node, stage))] + rest[best:]

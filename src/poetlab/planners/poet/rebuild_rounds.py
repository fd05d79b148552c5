"""The rebuild bound's point made a schedule interval by interval, and the stages it breaks added to the bound (NOTE 27
in docs/solve.md).

The rebuild bound (:mod:`poetlab.planners.poet.rebuilds`, NOTE 23) decides, for each tensor of its block and each
interval (t_k, t_k+1] between its chosen stages, whether it is held across t_k, rebuilt in the interval or paged in
for it. :func:`point_schedule` follows those decisions: a block tensor leaves RAM after its last read up to the first
chosen stage (paged out there where the point pages it), and in each interval where something reads it (a backward
node, or the rerun of a tensor it is an input of) it is held on from before where the point holds it (or decides
nothing), paged in just before its first such read (where it is not in RAM then), or rerun at that read (held on
without recomputation), and held to the last read of the interval. Every other tensor follows the covers' rule
(:func:`~poetlab.planners.poet.bounds.evict_schedule`). The earlier seed,
:func:`~poetlab.planners.poet.bounds.evict_schedule` of the tensors the point regenerates, evicts each over its
longest idle interval, so a backward stage rebuilt a layer's whole chain at once (bert_seq8/m4/0/2x: over RAM at stage
102); this one rebuilds a layer from what the point pages in.

The bound checks memory only at its chosen stages, so the point's schedule can be over RAM between them (on
bert_seq8/m4/0/2x by one qk_t at the stage after each chosen one: the qkv paged in for the layer's rebuild is held
beside it). :func:`over_stages` finds those stages (the MILP's accounting, :func:`~poetlab.planners.heuristics.stage_peaks`)
and :func:`rounds` solves the bound again with them added: the bound is valid at any stages, so each round's is a
bound, and a point that holds more there (bert_seq8/m4/0/2x: the qkv across stage 102, qk_t and qk_t_v rebuilt twice)
makes a schedule that fits (there 1.213014 plain steps, the new bound 1.213013: optimal, where the first round's
1.211081 left a 0.26% gap to the best schedule a repair found).

``point_schedule(..., settled=True)`` (NOTE 29) also evicts a block tensor in the forward pass where the point
regenerates it, and holds a tensor on into an interval whose first read is the stage after it was last in RAM: the
seed :func:`~poetlab.planners.poet.coherence.coherent_schedule` makes coherent (resnet50/jetsontx2/0/2x).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.planners.heuristics import minimal_recompute, stage_peaks
from poetlab.planners.poet.bounds import CoverProblem, evict_schedule
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.rebuilds import RebuildBound, rebuild_bound

#: at most this many rounds after the first (each adds the stages the last point's schedule is over RAM at)
MAX_ROUNDS = 3

#: a round runs only where the time left is this many times the round before's: a round about doubles the stages and
#: took 5-8 times as long (bert_seq8/m4/0/2x 0.18 s then 1.05 s; resnet18_cifar/m4/0.2/1.2x 0.49-0.74 s then 3.9 s),
#: and a round stopped by the time limit rarely gives a schedule that fits
ROUND_GROWTH = 6.0


def point_schedule(graph: TrainingGraph, bound: RebuildBound, remat: bool = True, settled: bool = False, forward_out: bool = False) -> Schedule | None:
    """The rebuild bound's point made a schedule interval by interval (module docstring); None without a point. Without
    ``remat`` (recomputation not allowed) a tensor the point pages in where a page-in cannot be placed is held on.

    ``settled`` (NOTE 29): a block tensor the point regenerates also leaves RAM over its longest idle interval before
    the first chosen stage where that interval ends by it (else it is held from its computation to its last read up to
    there: resnet50/jetsontx2/0's 3 MB skip-add 32, read at stage 302, over RAM at forward stage 62), and a tensor in RAM
    in the stage before its first read of an interval is held on instead of rerun there (the rerun's inputs cascade:
    a convolution rerun at 324 held the ReLU it reads from stage 10 on). Not in the rounds: on bert_seq8/m4/0/2x their
    second point fits only with its rerun of qk_t_v at stage 103, which frees stage 102 (NOTE 27). Settled, the point's
    memory at the chosen stages is followed too (NOTE 32, resnet50/m4/0/2x): a tensor it holds across t_k after
    rebuilding it in the interval before is rebuilt by t_k (not at its read, whose inputs would then be held across
    t_k), it is not held on across t_k where the point reruns it after t_k, and the chosen stages it is kept across are
    those from its last read on. ``forward_out``: a block tensor the point regenerates and holds across t_1 leaves RAM
    in the forward pass too (there the cover's rows count it out), back by t_1: resnet50/m4/0/2x's ReLU 29 and
    convolution 17 (774 KB each), over RAM from stage 152 to 214 otherwise; on resnet50/jetsontx2/0/2x it costs 4e-5."""
    if bound.held is None or not bound.stages:
        return None
    T = graph.n_nodes
    block = [int(a) for a in bound.block]
    in_block = np.zeros(T, dtype=bool)
    in_block[block] = True
    outside = evict_schedule(graph, bound.recompute & ~in_block, bound.page & ~in_block).matrices()
    S_RAM, S_SSD, M_IN, M_OUT = outside.S_RAM.copy(), outside.S_SSD.copy(), outside.M_IN.copy(), outside.M_OUT.copy()
    stages, t1 = list(bound.stages), bound.stages[0]
    ends = [*stages[1:], T]
    interval = np.full(T + 1, -1)
    for k, t in enumerate(stages):
        interval[t + 1 : ends[k] + 1] = k
    uses = [sorted(set(users)) for users in graph.consumers]
    reruns: dict[int, list[int]] = {}  # a tensor's rerun stages, so its inputs are there (consumers come first)
    for q in sorted(range(len(block)), key=lambda q: -block[q]):
        a = block[q]
        early = [u for u in uses[a] if u <= t1]
        last_early = max(early, default=a)
        reads = sorted({u for u in uses[a] if u > t1} | {s for c in uses[a] for s in reruns.get(c, ()) if s > t1})
        S_RAM[last_early + 1 :, a] = False
        present_to = last_early
        if settled and early and (bound.recompute[a] or bound.page[a]):
            # (held across t_1 by the point: out of RAM in the forward pass, as the cover's rows there count it, back by t_1)
            across = forward_out and bool(bound.held[0, q]) and bool(reads) and reads[0] > t1
            until = _evict_early(S_RAM, S_SSD, M_IN, M_OUT, a, [a, *early, t1 if across else reads[0]] if reads else [a, *early], t1, bool(bound.page[a]), remat, reruns)
            if until == t1:
                present_to = t1 - 1
        groups: dict[int, list[int]] = {}
        for s in reads:
            groups.setdefault(int(interval[s]), []).append(s)
        paged_out = bool(M_OUT[:, a].any())
        for k, stage_reads in sorted(groups.items()):
            first, last = stage_reads[0], stage_reads[-1]
            since = int(interval[present_to + 1]) if present_to >= t1 else 0
            if settled and present_to >= t1:  # (the chosen stages it is kept across: from present_to on, not the one before it)
                since = next((j for j, t in enumerate(stages) if t >= present_to), len(stages))
            held = all(bound.held[j, q] for j in range(max(since, 0), k + 1))
            paged_in = bound.paged[k, q]
            if settled and k and bound.held[k, q] and not held and (bound.rerun[k - 1, q] or bound.paged[k - 1, q]) and present_to < stages[k] - 1:
                first, paged_in = stages[k], bound.paged[k - 1, q]  # (held across t_k after its rebuild in the interval before: back by t_k)
            decided = bound.held[k, q] or bound.rerun[k, q] or paged_in
            page = paged_in and first - last_early >= 3 and present_to < first - 1  # (out after last_early, in at first - 1)
            # (settled: held on from the stage before, but not across t_k where the point reruns it after t_k instead)
            adjacent = settled and present_to >= first - 1 and not (bound.rerun[k, q] and not bound.held[k, q] and present_to >= stages[k])
            if held or not decided or not (page or remat) or adjacent:  # (no decision: a read beside node t_k; held on)
                S_RAM[present_to + 1 : last + 1, a] = True
            elif page:
                if not paged_out:
                    S_RAM[last_early + 1, a] = M_OUT[last_early + 1, a] = paged_out = True
                M_IN[first - 1, a] = True
                S_SSD[last_early + 2 : first, a] = True
                S_RAM[first : last + 1, a] = True
            else:  # rerun at its first read in the interval, held to its last
                S_RAM[first + 1 : last + 1, a] = True
                reruns.setdefault(a, []).append(first)
            present_to = last
    return Schedule.from_matrices(graph, minimal_recompute(graph, S_RAM, M_IN), S_RAM, S_SSD, M_IN, M_OUT)


def _evict_early(S_RAM, S_SSD, M_IN, M_OUT, a: int, points: list[int], t1: int, page: bool, remat: bool, reruns: dict[int, list[int]]) -> int | None:
    """Block tensor ``a`` out of RAM over its longest idle interval between ``points`` (its computation, its reads up to
    the first chosen stage ``t1`` and its first read after it) where that interval ends by ``t1``: paged out and in
    (``page``) or recomputed at its end (the covers' rule, :func:`~poetlab.planners.poet.bounds.evict_schedule`)."""
    k = int(np.argmax(np.diff(points)))
    previous, following = points[k], points[k + 1]
    if following - previous < 3 or following > t1:
        return None
    if page:
        S_RAM[previous + 2 : following, a] = False
        S_RAM[previous + 1, a] = M_OUT[previous + 1, a] = M_IN[following - 1, a] = True
        S_SSD[previous + 2 : following, a] = True
    elif remat:
        S_RAM[previous + 1 : following, a] = False
        reruns.setdefault(a, []).append(following)
    else:
        return None
    S_RAM[following, a] = True
    return following


def over_stages(graph: TrainingGraph, schedule: Schedule, tensor_bytes: float) -> list[int]:
    """The stages whose peak (the MILP's accounting) exceeds ``tensor_bytes``: where a point's schedule breaks."""
    matrices = schedule.matrices()
    return [int(t) for t in np.flatnonzero(stage_peaks(graph, matrices.R, matrices.S_RAM) > tensor_bytes + 1e-6)]


def worst_stages(graph: TrainingGraph, schedule: Schedule, tensor_bytes: float, count: int) -> list[int]:
    """The ``count`` stages whose peak (the MILP's accounting) exceeds ``tensor_bytes`` by the most bytes."""
    matrices = schedule.matrices()
    excess = stage_peaks(graph, matrices.R, matrices.S_RAM) - tensor_bytes
    return sorted(int(t) for t in np.argsort(-excess, kind="stable")[:count] if excess[t] > 1e-6)


def rounds(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, first: RebuildBound, tensor_bytes: float, time_limit_s: float,
    problem: CoverProblem | None = None,
) -> Iterator[tuple[RebuildBound, Schedule]]:
    """From a first bound solved to optimality: the bound again with the stages its point's schedule is over RAM at
    (those from the first chosen stage on, so the block stays), each round's bound and point's schedule yielded,
    until a schedule fits, a round has no point, or what is left of ``time_limit_s`` (all rounds) is under
    ``ROUND_GROWTH`` times the last round's time. A round stopped by the time limit gives its dual bound and its
    incumbent's point. ``problem``: the covering problem the first bound was built on, where the caller has it."""
    if not first.optimal:  # (a first round that needs its whole share, as on bert/m4/0 or the ResNets at 0: no rounds)
        return
    deadline = time.perf_counter() + time_limit_s
    bound, schedule = first, point_schedule(graph, first, options.remat)
    for _ in range(MAX_ROUNDS):
        if schedule is None:
            return
        added = [t for t in over_stages(graph, schedule, tensor_bytes) if t > bound.stages[0] and t not in bound.stages]
        left = deadline - time.perf_counter()
        if not added or left < ROUND_GROWTH * bound.seconds:
            return
        bound = rebuild_bound(graph, costs, options, time_limit_s=left, stages=sorted({*bound.stages, *added}), problem=problem)
        schedule = point_schedule(graph, bound, options.remat)
        if schedule is not None:
            yield bound, schedule

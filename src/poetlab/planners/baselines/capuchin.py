"""Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep Learning" (ASPLOS 2020).

Capuchin has no public code; this module is our reimplementation of its policy from the paper, on the
kit's one schedule format. Capuchin profiles one iteration ("measured execution"), records every
tensor access, and from then on evicts tensors during their idle intervals: after an *evicted access*
the tensor leaves device memory and comes back before its *back access*, either by swapping (copy out
after the evicted access, prefetch back in at an *in-trigger* so that the copy ends just before the back
access) or by recomputing it on demand from its nearest resident ancestors. Its hybrid policy, applied
until the peak memory fits: among the tensors held idle across the peak, swap the one with the largest
*free time* FT = (idle time between the two accesses) - (swap-out time) - (swap-in time) while some
FT > 0, because such a swap hides entirely under compute; once none does, take the recomputation
candidate with the largest MSPS (memory saving per second of recomputation, the recomputation chain
from resident ancestors included) and compare its recomputation time with the smallest swap stall
(-FT) of a swap candidate; do whichever costs less time.

What is reproduced: the profiled access pattern (checkpoint-all's order, which is the execution order
of a training step that keeps everything, timed with :class:`~poetlab.core.costs.CostModel` runtimes), idle
intervals per tensor, FT and the in-trigger computed from those times, the swap-first / MSPS hybrid
rule, on-demand recomputation that regenerates each missing tensor by its own policy (a swapped tensor
is paged in, any other recomputed, recursively), and greedy application at the current peak until it
fits. A hidden swap holds RAM until its copy out ends (the tensor is freed at the end of the stage in
which that copy finishes) and again from the start of its in-trigger's stage, so it frees RAM only in
the stages that lie wholly inside its free time; a swap that cannot hide (FT <= 0) is modelled as the
stall it is: copied out at once after its evicted access and paged in on demand at its back access.

What is not: Capuchin's runtime feedback that moves in-triggers earlier after a stall (our times are the
cost model's, so the first placement is final), contention between transfers on the one copy engine
(each transfer is timed as if it had the link to itself), the paper's memory-pool and collective-tensor
details, and TensorFlow's eager/graph modes. Capuchin could not recompute the input batch; the kit's
graphs make it a node like any other, which the MILP may recompute at its cost-model cost (zero flop in
the release), so :func:`plan` may recompute it too, for a like-for-like comparison, and
:func:`plan_swap_sources` only swaps it, as the paper would. Capuchin minimizes *time*; it is judged here, as in POET's
Fig. 5, on the energy our simulator sums, where its swaps and recomputations are not free. A tensor
paged out once stays on flash, so a later swap of the same tensor pages it in without a second copy out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions, within_budgets
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import Op, OpKind, Schedule, simulate

METHOD = "capuchin"


class Mode(enum.Enum):
    SWAP = "swap"
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class Profile:
    """One measured iteration: checkpoint-all's stages timed with the cost model.

    ``start_s[s]`` / ``end_s[s]`` bound the compute of stage s (which computes node s); ``accesses[i]``
    lists the stages that touch tensor i: the one that produces it, then each that reads it.
    """

    start_s: np.ndarray
    end_s: np.ndarray
    accesses: tuple[tuple[int, ...], ...]

    @property
    def last_use(self) -> np.ndarray:
        return np.array([acc[-1] for acc in self.accesses])


@dataclass(frozen=True)
class Eviction:
    """Tensor ``tensor`` leaves RAM between its evicted access (stage ``evicted_access``) and its back
    access (stage ``back_access``). It still holds RAM up to the end of stage ``out_stage`` (a swap-out
    still copying) and holds it again from stage ``in_stage`` on (prefetched, or regenerated there).
    ``free_time_s`` is the paper's FT for a swap of this interval."""

    tensor: int
    evicted_access: int
    back_access: int
    mode: Mode
    out_stage: int
    in_stage: int
    free_time_s: float

    def relieves(self, stage: int) -> bool:
        return self.out_stage < stage < self.in_stage


@dataclass(frozen=True)
class CapuchinPlan:
    """The evictions Capuchin chose, in the order it chose them, and the schedule they give."""

    evictions: tuple[Eviction, ...]
    schedule: Schedule


def profile(graph: TrainingGraph, costs: CostModel) -> Profile:
    """The access pattern of checkpoint-all, timed: stage s computes node s after stages 0..s-1."""
    end = np.cumsum(costs.runtime_s)
    start = end - costs.runtime_s
    accesses = tuple((i, *users) for i, users in enumerate(graph.consumers))
    return Profile(start_s=start, end_s=end, accesses=accesses)


def idle_interval(accesses: tuple[int, ...], stage: int) -> tuple[int, int] | None:
    """The (evicted access, back access) pair of consecutive accesses around ``stage``, or None when the
    tensor is accessed in ``stage``, not yet produced, or never read again."""
    before = [a for a in accesses if a < stage]
    after = [a for a in accesses if a > stage]
    if stage in accesses or not before or not after:
        return None
    return before[-1], after[0]


def swap_eviction(prof: Profile, costs: CostModel, tensor: int, a: int, b: int) -> Eviction:
    """Swap out after access ``a`` and back in for access ``b``.

    With FT > 0 the swap hides under compute, and it is timed as the paper times it: the copy out
    starts when stage a ends and the tensor holds RAM until the stage in which that copy ends; the
    in-trigger is the stage during which the copy in must start to end exactly when b starts, and the
    prefetch is issued at that stage's start. With FT <= 0 the copy cannot hide and Capuchin accepts a
    stall of -FT: we model it as a copy out waited for at the end of stage a and a copy in on demand at
    b, so the tensor is out of RAM over the whole idle interval.
    """
    free_time = float(prof.start_s[b] - prof.end_s[a] - costs.pageout_time_s[tensor] - costs.pagein_time_s[tensor])
    if free_time <= 0:
        return Eviction(tensor, a, b, Mode.SWAP, a, b, free_time)
    out_done = prof.end_s[a] + costs.pageout_time_s[tensor]
    out_stage = min(max(int(np.searchsorted(prof.end_s, out_done, side="left")), a), b)
    in_start = prof.start_s[b] - costs.pagein_time_s[tensor]
    in_stage = min(max(int(np.searchsorted(prof.start_s, in_start, side="right")) - 1, a + 1), b)
    return Eviction(tensor, a, b, Mode.SWAP, out_stage, in_stage, free_time)


def recompute_eviction(prof: Profile, costs: CostModel, tensor: int, a: int, b: int) -> Eviction:
    """Free right after access ``a``; recompute on demand at ``b`` (Capuchin has no in-trigger for
    recomputation)."""
    free_time = float(prof.start_s[b] - prof.end_s[a] - costs.pageout_time_s[tensor] - costs.pagein_time_s[tensor])
    return Eviction(tensor, a, b, Mode.RECOMPUTE, a, b, free_time)


def planned_residency(prof: Profile, evictions: tuple[Eviction, ...]) -> np.ndarray:
    """keep[s, i]: tensor i is held in RAM at the end of stage s - 1, i.e. carried into stage s.

    Checkpoint-all keeps each tensor from its producing stage to its last use; an eviction drops it
    from the end of ``out_stage`` until it is brought back during ``in_stage``.
    """
    T = len(prof.accesses)
    stage = np.arange(T + 1)[:, None]
    node = np.arange(T)[None, :]
    keep = (node < stage) & (prof.last_use[None, :] >= stage)
    for e in evictions:
        keep[e.out_stage + 1 : e.in_stage + 1, e.tensor] = False
    return keep


def _regeneration_mode(evictions: tuple[Eviction, ...], T: int) -> list[dict[int, Mode]]:
    """For each stage, the policy of each tensor evicted across it (absent: recompute)."""
    modes: list[dict[int, Mode]] = [{} for _ in range(T)]
    for e in evictions:
        for s in range(e.out_stage + 1, e.in_stage + 1):
            modes[s][e.tensor] = e.mode
    return modes


def _regeneration(
    graph: TrainingGraph, stage: int, resident: np.ndarray, modes: dict[int, Mode]
) -> tuple[list[int], list[int]]:
    """What stage ``stage`` must bring back before computing its node: (page-ins, recomputations in
    topological order). A missing tensor evicted by swap across this stage is paged in; any other
    missing tensor is recomputed, after its own missing inputs."""
    page_in: set[int] = set()
    recompute: set[int] = set()
    stack = [u for u in set(graph.nodes[stage].inputs) if not resident[u]]
    while stack:
        u = stack.pop()
        if u in page_in or u in recompute:
            continue
        if modes.get(u) is Mode.SWAP:
            page_in.add(u)
            continue
        recompute.add(u)
        stack.extend(v for v in set(graph.nodes[u].inputs) if not resident[v])
    return sorted(page_in), sorted(recompute)


def emit(graph: TrainingGraph, prof: Profile, evictions: tuple[Eviction, ...]) -> Schedule:
    """The operations of checkpoint-all with ``evictions`` applied, stage by stage.

    Stage t: prefetches whose in-trigger is t; the page-ins and recomputations its node's missing
    inputs need (each intermediate freed after its last reader there unless kept); the node itself;
    swap-outs whose evicted access is t; then every tensor not carried into stage t + 1 is freed.
    """
    T = graph.n_nodes
    keep = planned_residency(prof, evictions)
    modes = _regeneration_mode(evictions, T)
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    prefetch: list[list[int]] = [[] for _ in range(T)]
    swap_out: list[list[int]] = [[] for _ in range(T)]
    for e in evictions:
        if e.mode is Mode.SWAP:
            swap_out[e.evicted_access].append(e.tensor)
            prefetch[e.in_stage].append(e.tensor)
    resident = np.zeros(T, dtype=bool)
    on_flash = np.zeros(T, dtype=bool)
    ops: list[Op] = []
    for t in range(T):
        for i in sorted(prefetch[t]):
            ops.append(Op(OpKind.PAGE_IN, i, t))
            resident[i] = True
        page_in, recompute = _regeneration(graph, t, resident, modes[t])
        for i in page_in:
            ops.append(Op(OpKind.PAGE_IN, i, t))
            resident[i] = True
        readers = [*recompute, t]
        for position, k in enumerate(readers):
            ops.append(Op(OpKind.COMPUTE, k, t))
            resident[k] = True
            if k == t:
                break
            later = {u for j in readers[position + 1 :] for u in inputs[j]}
            for u in inputs[k]:
                if resident[u] and u not in later and not keep[t + 1, u]:
                    ops.append(Op(OpKind.FREE, u, t))
                    resident[u] = False
        for i in sorted(swap_out[t]):
            if not on_flash[i]:
                ops.append(Op(OpKind.PAGE_OUT, i, t))
                on_flash[i] = True
        for i in np.flatnonzero(resident & ~keep[t + 1]):
            ops.append(Op(OpKind.FREE, int(i), t))
            resident[i] = False
    return Schedule(n_nodes=T, ops=tuple(ops))


def recompute_time_s(
    graph: TrainingGraph, costs: CostModel, keep: np.ndarray, evictions: tuple[Eviction, ...], e: Eviction
) -> float:
    """Seconds of compute to regenerate ``e.tensor`` at its back access: the tensor and every missing
    ancestor back to the nearest resident (or swapped-out) ones, under the plan so far."""
    b = e.back_access
    swapped = {x.tensor for x in evictions if x.mode is Mode.SWAP and x.out_stage < b <= x.in_stage}
    seen, stack, total = {e.tensor}, [e.tensor], 0.0
    while stack:
        u = stack.pop()
        total += float(costs.recompute_runtime_s[u])
        for v in set(graph.nodes[u].inputs):
            if v not in seen and not keep[b, v] and v not in swapped:
                seen.add(v)
                stack.append(v)
    return total


@dataclass(frozen=True)
class Candidate:
    """A tensor held idle across the peak stage, between its accesses ``a`` and ``b``. ``swappable``:
    the interval is not evicted yet; otherwise it is swapped without relief at the peak (its copy out
    has not ended or its prefetch has begun), and may only be turned into a recomputation."""

    tensor: int
    a: int
    b: int
    swappable: bool


def candidates_at(
    graph: TrainingGraph, prof: Profile, keep: np.ndarray, evictions: tuple[Eviction, ...], stage: int
) -> list[Candidate]:
    """Every tensor in RAM during ``stage`` (carried into it or prefetched at its start) and idle across
    it whose interval is free, or swapped but not relieving ``stage``."""
    taken = {(e.tensor, e.evicted_access): e for e in evictions}
    present = keep[stage].copy()
    present[[e.tensor for e in evictions if e.mode is Mode.SWAP and e.in_stage == stage]] = True
    found = []
    for i in map(int, np.flatnonzero(present & (graph.output_bytes > 0) & ~graph.pinned)):
        interval = idle_interval(prof.accesses[i], stage)
        if interval is None:
            continue
        existing = taken.get((i, interval[0]))
        if existing is None:
            found.append(Candidate(i, *interval, swappable=True))
        elif existing.mode is Mode.SWAP and not existing.relieves(stage):
            found.append(Candidate(i, *interval, swappable=False))
    return found


def choose(
    graph: TrainingGraph,
    costs: CostModel,
    prof: Profile,
    evictions: tuple[Eviction, ...],
    stage: int,
    recompute_sources: bool = True,
) -> Eviction | None:
    """The paper's hybrid rule at the peak ``stage``: the hidden swap (FT > 0) with the largest FT if
    any; otherwise the cheaper in time of the best recomputation (largest MSPS) and the least-stalling
    swap. Only evictions that free RAM during ``stage`` count. A swap chosen earlier that does not
    relieve ``stage`` may be replaced by a recomputation of the same interval (which frees RAM over
    the whole interval): Capuchin decides each interval once, but a prefetch that lands inside a
    later peak must give way for the peak to fit."""
    keep = planned_residency(prof, evictions)
    swaps, recomputes = [], []
    for c in candidates_at(graph, prof, keep, evictions, stage):
        swap = swap_eviction(prof, costs, c.tensor, c.a, c.b)
        if c.swappable and swap.relieves(stage):
            swaps.append(swap)
        if recompute_sources or graph.nodes[c.tensor].inputs:
            recomputes.append(recompute_eviction(prof, costs, c.tensor, c.a, c.b))
    hidden = [s for s in swaps if s.free_time_s > 0]
    if hidden:
        return max(hidden, key=lambda s: (s.free_time_s, graph.output_bytes[s.tensor]))
    best_recompute, best_time, best_msps = None, np.inf, -np.inf
    for r in recomputes:
        seconds = recompute_time_s(graph, costs, keep, evictions, r)
        msps = graph.output_bytes[r.tensor] / max(seconds, 1e-300)  # memory saving per second
        if msps > best_msps:
            best_recompute, best_time, best_msps = r, seconds, msps
    best_swap = max(swaps, key=lambda s: (s.free_time_s, graph.output_bytes[s.tensor]), default=None)
    if best_swap is not None and (best_recompute is None or -best_swap.free_time_s < best_time):
        return best_swap
    return best_recompute


def plan_evictions(graph: TrainingGraph, costs: CostModel, ram_bytes: float, recompute_sources: bool = True) -> CapuchinPlan:
    """Apply the hybrid rule at the simulated peak until the schedule fits ``ram_bytes``. Without
    ``recompute_sources`` the graph's sources (the input batch) are only ever swapped.

    Every step evicts a free (tensor, idle interval) pair or turns a swapped one into a recomputation,
    so the loop ends after at most twice as many steps as there are idle intervals.
    """
    footprint, node = min_footprint_bytes(graph)
    if ram_bytes < footprint:
        raise CannotMeetBudget(
            f"{METHOD}: RAM budget {int(ram_bytes):,} bytes is below node {graph.nodes[node].name}'s footprint "
            f"(output and inputs) of {footprint:,} bytes"
        )
    prof = profile(graph, costs)
    evictions: tuple[Eviction, ...] = ()
    while True:
        schedule = emit(graph, prof, evictions)
        trace = simulate(schedule, graph, costs).memory_trace_bytes
        step = int(trace.argmax())
        if trace[step] <= ram_bytes:
            return CapuchinPlan(evictions, schedule)
        stage = schedule.ops[step].stage
        chosen = choose(graph, costs, prof, evictions, stage, recompute_sources)
        if chosen is None:
            raise CannotMeetBudget(
                f"{METHOD}: peak {int(trace[step]):,} bytes at stage {stage} ({graph.nodes[stage].name}) is over the "
                f"budget {int(ram_bytes):,} bytes and no tensor idle across it is left to swap or recompute"
            )
        evictions = (*(e for e in evictions if (e.tensor, e.evicted_access) != (chosen.tensor, chosen.evicted_access)), chosen)


def _plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, recompute_sources: bool) -> Schedule:
    return within_budgets(METHOD, plan_evictions(graph, costs, budgets.ram_bytes, recompute_sources).schedule, graph, costs, budgets)


def plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """Capuchin's schedule for ``budgets``; CannotMeetBudget when its evictions cannot reach the RAM
    budget or its recomputations break the runtime budget."""
    return _plan(graph, costs, budgets, recompute_sources=True)


def plan_swap_sources(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """Capuchin that never recomputes the input batch (it may still swap it), as in the paper."""
    return _plan(graph, costs, budgets, recompute_sources=False)

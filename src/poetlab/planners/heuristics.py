"""Quick feasible schedules to start the MILP from: checkpoint-all, then greedy paging or greedy remat.

On large graphs HiGHS can spend minutes in the root LP before it finds any solution, so a solve that
stops at its time limit may have nothing to show. These heuristics give it (and the user) a valid
schedule at once. Both start from checkpoint-all and, while the stage of peak memory is over the
budget, evict a tensor that sits idle in RAM across that stage, choosing the one that frees the most
bytes per joule: greedy paging pages it out after one use and back in just before the next; greedy
remat drops it and recomputes it (and whatever else the stage then lacks) when it is needed. The MILP
then only has to improve on the better of the two; if it cannot, that schedule is the answer, with its
gap to the MILP's bound.
"""

from __future__ import annotations

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule


def _stage_memory(S_RAM: np.ndarray, M_IN: np.ndarray, nbytes: np.ndarray, prefetch: bool) -> np.ndarray:
    """RAM at the peak of each stage when stage t computes only node t (Checkmate accounting)."""
    memory = S_RAM.astype(float) @ nbytes + nbytes
    if prefetch:
        memory += M_IN.astype(float) @ nbytes
    return memory


def greedy_paging_schedule(
    graph: TrainingGraph,
    costs: CostModel,
    ram_budget_bytes: float,
    prefetch: bool = False,
) -> Schedule | None:
    """A schedule with no recomputation whose every stage fits ``ram_budget_bytes``, or None.

    The budget is checked with the MILP's accounting; the caller replays the result with
    :func:`~poetlab.core.schedule.simulate` before trusting it.
    """
    T = graph.n_nodes
    nbytes = graph.output_bytes.astype(float)
    uses = [sorted(set(users)) for users in graph.consumers]
    stage = np.arange(T)
    # checkpoint-all: tensor i is held at the start of stages i+1 .. last use
    last_use = np.array([u[-1] if u else i for i, u in enumerate(uses)])
    S_RAM = (stage[None, :] < stage[:, None]) & (last_use[None, :] >= stage[:, None])
    S_SSD = np.zeros((T, T), dtype=bool)
    M_IN = np.zeros((T, T), dtype=bool)
    M_OUT = np.zeros((T, T), dtype=bool)
    paged: list[list[tuple[int, int]]] = [[] for _ in range(T)]  # per tensor, the idle intervals spent on flash
    is_input = np.zeros((T, T), dtype=bool)
    for k, node in enumerate(graph.nodes):
        is_input[k, list(set(node.inputs))] = True
    paging_energy = costs.pagein_energy_j + costs.pageout_energy_j

    def apply(i: int) -> None:
        """Rewrite tensor i's column from its paged intervals."""
        intervals = sorted(paged[i])
        S_RAM[:, i] = (stage > i) & (stage <= last_use[i])
        S_SSD[:, i] = M_IN[:, i] = M_OUT[:, i] = False
        out_stage = intervals[0][0] + 1
        M_OUT[out_stage, i] = True
        for previous, following in intervals:
            first_gone = previous + 2 if previous + 1 == out_stage else previous + 1
            S_RAM[first_gone:following, i] = False
            M_IN[following - 1, i] = True
        S_SSD[out_stage + 1 : intervals[-1][1], i] = True

    memory = _stage_memory(S_RAM, M_IN, nbytes, prefetch)
    while memory.max() > ram_budget_bytes:
        t = int(memory.argmax())
        best, best_score = None, 0.0
        for i in np.flatnonzero(S_RAM[t] & ~is_input[t] & ~graph.pinned):
            earlier = [u for u in uses[i] if u < t]
            previous = max(earlier) if earlier else int(i)
            following = min(u for u in uses[i] if u > t)
            first_out = min([p for p, _ in paged[i]] + [previous]) + 1
            gone_from = previous + 2 if previous + 1 == first_out else previous + 1
            if not gone_from <= t <= following - 1 or following - 1 < first_out + 1:
                continue
            score = nbytes[i] / max(paging_energy[i], 1e-300)
            if score > best_score:
                best, best_score = int(i), score
        if best is None:
            return None
        paged[best].append((max([u for u in uses[best] if u < t], default=best), min(u for u in uses[best] if u > t)))
        apply(best)
        memory = _stage_memory(S_RAM, M_IN, nbytes, prefetch)
    return Schedule.from_matrices(graph, np.eye(T, dtype=bool), S_RAM, S_SSD, M_IN, M_OUT, prefetch=prefetch)


def minimal_recompute(graph: TrainingGraph, S_RAM: np.ndarray, M_IN: np.ndarray | None = None) -> np.ndarray:
    """The fewest recomputations that make ``S_RAM`` (what each stage holds) consistent: stage t
    computes node t, every tensor S_RAM[t + 1] keeps that S_RAM[t] does not hold (unless ``M_IN`` pages
    it in during stage t), and, going backwards, every node that a node computed in stage t reads and
    S_RAM[t] does not hold (Checkmate's R for a given S)."""
    S_RAM = np.asarray(S_RAM, dtype=bool)
    M_IN = None if M_IN is None else np.asarray(M_IN, dtype=bool)
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    return np.array([stage_recompute(inputs, S_RAM, M_IN, t) for t in range(graph.n_nodes)], dtype=bool).reshape(graph.n_nodes, graph.n_nodes)


def stage_recompute(inputs: list[list[int]], S_RAM: np.ndarray, M_IN: np.ndarray | None, t: int) -> np.ndarray:
    """Row t of :func:`minimal_recompute` (``inputs``: each node's input indices), for callers that
    change a few stages of ``S_RAM`` at a time and rebuild only those rows."""
    T = S_RAM.shape[0]
    r = np.zeros(T, dtype=bool)
    r[t] = True
    if t + 1 < T:
        arrives = S_RAM[t + 1] & ~S_RAM[t]
        r |= arrives if M_IN is None else arrives & ~M_IN[t]
    for v in range(t, -1, -1):
        if r[v]:
            for u in inputs[v]:
                if not S_RAM[t, u]:
                    r[u] = True
    return r


def stage_peak(inputs: list[list[int]], nbytes: np.ndarray, R_t: np.ndarray, S_now: np.ndarray, S_next: np.ndarray) -> float:
    """One stage of :func:`stage_peaks` (``R_t``, ``S_now``, ``S_next``: rows t and t + 1), for callers that
    change a few stages at a time and price only those."""
    computed = np.flatnonzero(R_t)
    last_reader = {}
    for k in computed:
        for i in inputs[k]:
            last_reader[i] = k
    memory = float(S_now @ nbytes)
    peak = 0.0
    for k in computed:
        memory += nbytes[k]
        peak = max(peak, memory)
        memory -= sum(float(nbytes[i]) for i in inputs[k] if last_reader[i] == k and not S_next[i])
    return peak


def stage_peaks(graph: TrainingGraph, R: np.ndarray, S_RAM: np.ndarray) -> np.ndarray:
    """Peak RAM of each stage under the MILP's accounting: what S_RAM holds, plus each computed
    output, minus inputs freed after their last reader in the stage unless kept for the next."""
    T = graph.n_nodes
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    last = np.zeros(T, dtype=bool)
    return np.array([stage_peak(inputs, graph.output_bytes, R[t], S_RAM[t], S_RAM[t + 1] if t + 1 < T else last) for t in range(T)], dtype=float)


def greedy_remat_schedule(
    graph: TrainingGraph,
    costs: CostModel,
    ram_budget_bytes: float,
    runtime_budget_s: float | None = None,
) -> Schedule | None:
    """A schedule with no paging that fits ``ram_budget_bytes``, or None: from checkpoint-all, drop
    from the stage of peak memory the idle tensor that frees the most bytes per joule of recomputing
    it, recomputing (with the fewest recomputations) whatever a stage then lacks, until every stage
    fits. None too when the recomputations break ``runtime_budget_s``."""
    T = graph.n_nodes
    uses = [sorted(set(users)) for users in graph.consumers]
    stage = np.arange(T)
    last_use = np.array([u[-1] if u else i for i, u in enumerate(uses)])
    S_RAM = (stage[None, :] < stage[:, None]) & (last_use[None, :] >= stage[:, None])
    R = np.eye(T, dtype=bool)
    energy = np.maximum(costs.recompute_energy_j, 1e-300)
    nbytes = graph.output_bytes.astype(float)
    peaks = stage_peaks(graph, R, S_RAM)
    while peaks.max() > ram_budget_bytes:
        t = int(peaks.argmax())
        read_in_stage = np.zeros(T, dtype=bool)
        for k in np.flatnonzero(R[t]):
            read_in_stage[list(set(graph.nodes[k].inputs))] = True
        candidates = np.flatnonzero(S_RAM[t] & ~read_in_stage & ~graph.pinned)
        if candidates.size == 0:
            return None
        i = int(candidates[np.argmax(nbytes[candidates] / energy[candidates])])
        earlier = [u for u in uses[i] if u < t]
        previous = max(earlier) if earlier else i
        following = min(u for u in uses[i] if u >= t)
        S_RAM[previous + 1 : following + 1, i] = False  # recomputed in stage `following`, kept after
        R = minimal_recompute(graph, S_RAM)
        peaks = stage_peaks(graph, R, S_RAM)
    if runtime_budget_s is not None and costs.computes_runtime_s(R) > runtime_budget_s:
        return None
    return Schedule.from_matrices(graph, R, S_RAM)

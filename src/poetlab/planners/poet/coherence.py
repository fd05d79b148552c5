"""A seed schedule's recomputations made coherent with its paging: no tensor rerun while its copy waits on flash, no
rerun repeated where holding the first fits (NOTE 29 in docs/solve.md).

The schedules built from a bound's point (:func:`~poetlab.planners.poet.bounds.evict_schedule`,
:func:`~poetlab.planners.poet.rebuild_rounds.point_schedule`) decide each tensor on its own: a convolution paged out
over its longest idle interval and paged in just before its own next read, the batch-norm after it recomputed where
*its* next read is. Where that batch-norm's read comes first, the recomputations that make the matrices consistent
(:func:`~poetlab.planners.heuristics.minimal_recompute`) rerun the convolution, and whatever it reads, instead of paging
it in a stage earlier: on resnet50/jetsontx2 at its smallest footprint the point's schedule by intervals cost 1.092
plain steps against its bound's 1.003302, mostly convolutions rerun three times. And a chain rebuilt for one read
(a ReLU from its skip-add from a batch-norm) is rebuilt again for the next read a stage later, where holding it across
that stage costs nothing. :func:`coherent_schedule` fixes both on the matrices:

- a tensor recomputed in stage s while paged out, with a page-in planned in stage u >= s, is paged in at the end of
  stage s - 1 instead, where that saves energy (the rerun chain against a page-in): the planned page-in moved there where it is at most ``MOVE_STAGES`` later (the tensor held
  from s to u), else a second page-in (holding it that long would take RAM the seed did not plan for); the latest
  tensor of the stage's recomputations first, so the rerun chain below it goes away with it;
- then a tensor recomputed in two stages s1 < s2 and not in RAM between is held from s1 to s2 where no stage between
  goes over the budget (or over what it was), the costliest rerun first, until none applies;
- last, at a stage over the budget, a tensor paged in for the rerun of its consumer there and kept for the next stage
  (POET's matrices cannot free it and page it in again) is paged in a stage later, its consumer paged in instead
  (resnet50/m4/0/2x: a convolution held across a stage of no room, NOTE 32).

A page-in moved earlier (the tensor held between) is moved only where no stage between goes over the budget (or
over what it was); else a second page-in serves the rerun (NOTE 32).

It finds schedules, not bounds; the caller replays what comes out like every start (and repairs it where it is over
RAM: the stages the point's own rows do not see).
"""

from __future__ import annotations

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.planners.heuristics import stage_peak, stage_recompute

#: a page-in planned at most this many stages after the rerun that needs the tensor is moved before that rerun (the
#: tensor held in between); a later one stays, and a second page-in serves the rerun
MOVE_STAGES = 2
#: at most this many page-ins moved or added (each a few milliseconds on resnet50; 20-30 there)
MAX_MOVES = 400


class _Seed:
    """The matrices being changed, with R (the fewest recomputations) and each stage's peak kept up to date."""

    def __init__(self, graph: TrainingGraph, S_RAM, S_SSD, M_IN, M_OUT):
        self.T = T = graph.n_nodes
        self.inputs = [sorted(set(node.inputs)) for node in graph.nodes]
        self.nbytes = graph.output_bytes.astype(float)
        self.S_RAM, self.S_SSD, self.M_IN, self.M_OUT = (np.array(m[:T], dtype=bool) for m in (S_RAM, S_SSD, M_IN, M_OUT))
        self.R = np.array([stage_recompute(self.inputs, self.S_RAM, self.M_IN, t) for t in range(T)])
        self.peaks = np.array([self.peak(t) for t in range(T)])

    def peak(self, t: int, S_RAM: np.ndarray | None = None, R: np.ndarray | None = None) -> float:
        S_RAM = self.S_RAM if S_RAM is None else S_RAM
        R_t = self.R[t] if R is None else R[t]
        return stage_peak(self.inputs, self.nbytes, R_t, S_RAM[t], S_RAM[t + 1] if t + 1 < self.T else np.zeros(self.T, dtype=bool))

    def refresh(self, stages: range) -> None:
        for t in stages:
            self.R[t] = stage_recompute(self.inputs, self.S_RAM, self.M_IN, t)
        for t in stages:
            self.peaks[t] = self.peak(t)


def _page_in_before_reruns(seed: _Seed, costs: CostModel, budget_bytes: float | None = None) -> None:
    """Each rerun of a tensor that waits on flash for a later page-in: paged in the stage before instead where that
    saves energy (a rerun chain for a page-in; on a platform where the rerun is cheaper it stays), stage by stage, the
    latest tensor of a stage first; at most ``MAX_MOVES`` changes. With ``budget_bytes``, a planned page-in is moved
    (the tensor held between) only where no stage between goes over the budget (or over its peak before); else a
    second page-in serves the rerun (resnet50/m4/0/2x: a convolution held across a stage of no room, NOTE 32)."""
    T, moves, s = seed.T, 0, 0
    while s < T and moves < MAX_MOVES:
        moved = False
        for i in np.flatnonzero(seed.R[s])[::-1]:
            outs = np.flatnonzero(seed.M_OUT[:, i])
            later = np.flatnonzero(seed.M_IN[max(s - 1, 0) :, i]) + max(s - 1, 0)
            if i == s or not outs.size or outs[0] > s - 2 or not later.size or later[0] == s - 1:
                continue
            u = int(later[0])
            tries = (True, False) if u - s <= MOVE_STAGES and budget_bytes is not None else (u - s <= MOVE_STAGES,)
            if any(_paged_in_before(seed, costs, i, s, u, move, budget_bytes) for move in tries):
                moves, moved = moves + 1, True
                break
        if not moved:
            s += 1


def _paged_in_before(seed: _Seed, costs: CostModel, i: int, s: int, u: int, move: bool, budget_bytes: float | None) -> bool:
    """Tensor i, rerun in stage s and paged in at u later, paged in at the end of stage s - 1 instead: the page-in at
    u moved there (``move``, i held from s to u) or a second one; kept where it saves energy (and, with
    ``budget_bytes``, where a moved one puts no stage between over the budget or over its peak before)."""
    T, rerun, pagein = seed.T, costs.recompute_energy_j, costs.pagein_energy_j
    kept = (seed.S_RAM.copy(), seed.S_SSD.copy(), seed.M_IN.copy(), seed.R.copy(), seed.peaks.copy())
    stages = range(max(s - 2, 0), min(u + 2, T))
    before = float(seed.R[stages.start : stages.stop].sum(axis=0) @ rerun + seed.M_IN.sum(axis=0) @ pagein)
    if move:
        seed.M_IN[u, i] = False
        seed.S_RAM[s : u + 1, i] = True
        seed.S_SSD[s - 1 : u + 1, i] = False
    else:
        seed.S_RAM[s, i] = True
        seed.S_SSD[s, i] = False
    seed.M_IN[s - 1, i] = True
    seed.refresh(stages)
    fits = not (move and budget_bytes is not None) or all(seed.peaks[t] <= max(budget_bytes, kept[4][t]) + 1e-6 for t in stages)
    if fits and float(seed.R[stages.start : stages.stop].sum(axis=0) @ rerun + seed.M_IN.sum(axis=0) @ pagein) < before:
        return True
    seed.S_RAM, seed.S_SSD, seed.M_IN, seed.R, seed.peaks = kept
    return False


def _hold_reruns(seed: _Seed, costs: CostModel, budget_bytes: float) -> None:
    """Each tensor recomputed in s1 and again in s2 with nothing of it in RAM between: held from s1 where every stage
    between stays within the budget (or within its peak before), the costliest rerun first, until none applies."""
    T, energy = seed.T, costs.recompute_energy_j
    while True:
        candidates = []
        for i in np.flatnonzero(seed.R.sum(axis=0) > 2):
            stages = [int(s) for s in np.flatnonzero(seed.R[:, i]) if s != i]
            candidates += [(energy[i], int(i), s1, s2) for s1, s2 in zip(stages, stages[1:]) if not seed.S_RAM[s1 + 1 : s2 + 1, i].any()]
        for _, i, s1, s2 in sorted(candidates, key=lambda c: -c[0]):
            if _held(seed, i, s1, s2, energy, budget_bytes):
                break
        else:
            return


def _held(seed: _Seed, i: int, s1: int, s2: int, energy: np.ndarray, budget_bytes: float) -> bool:
    """Tensor i held from stage s1 to s2 where that saves energy and no stage between goes over; whether it was."""
    T = seed.T
    S_RAM, R = seed.S_RAM.copy(), seed.R.copy()
    S_RAM[s1 + 1 : s2 + 1, i] = True
    stages = range(max(0, s1 - 1), min(T, s2 + 2))
    for t in stages:
        R[t] = stage_recompute(seed.inputs, S_RAM, seed.M_IN, t)
    if float(R[stages.start : stages.stop].sum(axis=0) @ energy) >= float(seed.R[stages.start : stages.stop].sum(axis=0) @ energy):
        return False
    peaks = [seed.peak(t, S_RAM, R) for t in stages]
    if any(p > max(budget_bytes, seed.peaks[t]) + 1e-6 for t, p in zip(stages, peaks)):
        return False
    seed.S_RAM, seed.R = S_RAM, R
    seed.peaks[stages.start : stages.stop] = peaks
    return True


def _page_consumers_in(seed: _Seed, budget_bytes: float) -> None:
    """At each stage t over the budget, a tensor x paged in at t - 1 and kept for the next stage, read in t only by the
    rerun of a consumer y: y paged in at t - 1 instead (paged out after its computation where it is not on flash yet) and
    x's page-in moved to stage t, where that brings t's peak down without putting another stage over the budget (or
    over its peak before). POET's matrices cannot free a tensor in a stage and page it in again for the next, so a
    point that pages a convolution in for its batch-norm's rerun in a stage of no room and again for the stage after
    (the rebuild bound's rows allow it) needs the batch-norm paged in (resnet50/m4/0/2x, NOTE 32)."""
    T = seed.T
    consumers: list[list[int]] = [[] for _ in range(T)]
    for c, inputs in enumerate(seed.inputs):
        for i in inputs:
            consumers[i].append(c)
    for t in range(1, T - 1):
        if seed.peaks[t] <= budget_bytes + 1e-6:
            continue
        for x in np.flatnonzero(seed.S_RAM[t] & seed.S_RAM[t + 1] & seed.M_IN[t - 1]):
            readers = [y for y in consumers[x] if seed.R[t, y] and y != t]
            if x in seed.inputs[t] or len(readers) != 1 or seed.peaks[t] <= budget_bytes + 1e-6:
                continue
            y = readers[0]
            kept = (seed.S_RAM.copy(), seed.S_SSD.copy(), seed.M_IN.copy(), seed.M_OUT.copy(), seed.R.copy(), seed.peaks.copy())
            if not (seed.M_OUT[: t - 1, y].any() and seed.S_SSD[t - 1, y]):
                if not seed.S_RAM[y + 1, y] or y + 2 >= t:
                    continue
                seed.M_OUT[y + 1, y] = True
                seed.S_SSD[y + 2 : t, y] = True
            seed.M_IN[t - 1, y] = seed.S_RAM[t, y] = True
            seed.M_IN[t - 1, x], seed.S_RAM[t, x] = False, False
            seed.M_IN[t, x] = seed.S_SSD[t, x] = True
            stages = range(max(y, 0), min(t + 2, T))
            seed.refresh(stages)
            if seed.peaks[t] < kept[5][t] and all(seed.peaks[r] <= max(budget_bytes, kept[5][r]) + 1e-6 for r in stages if r != t):
                continue
            seed.S_RAM, seed.S_SSD, seed.M_IN, seed.M_OUT, seed.R, seed.peaks = kept


def coherent_schedule(graph: TrainingGraph, costs: CostModel, schedule: Schedule, budget_bytes: float) -> Schedule:
    """``schedule`` with its reruns of paged-out tensors made page-ins and its repeated reruns held where RAM allows
    (module docstring); ``budget_bytes``: the RAM the tensors may take (the budget less what is kept free)."""
    matrices = schedule.matrices()
    seed = _Seed(graph, matrices.S_RAM, matrices.S_SSD, matrices.M_IN, matrices.M_OUT)
    _page_in_before_reruns(seed, costs, budget_bytes)
    _hold_reruns(seed, costs, budget_bytes)
    _page_consumers_in(seed, budget_bytes)
    return Schedule.from_matrices(graph, seed.R, seed.S_RAM, seed.S_SSD, seed.M_IN, seed.M_OUT)

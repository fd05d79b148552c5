"""Schedules made to fit, then made cheaper, by moving single tensors between the two levers.

The quick starts and the relaxations' schedules often miss one budget by a little: the eviction
bound's cover and DTR without a runtime budget recompute more than a tight runtime budget (1.05x)
allows, and the interval relaxation's schedule at the exact budget is a few kilobytes over RAM inside a
stage (it does not see RAM while a recomputation runs). Dropped, they leave starts far dearer than they
are (on resnet50/m4 at 10% and 1.05x only paging-heavy schedules were left, 1.27 plain steps). Here a
schedule's matrices (what each stage keeps in RAM, pages in and out; recomputations are the fewest that
make the rest consistent: :func:`~poetlab.planners.heuristics.minimal_recompute`) are changed one tensor
interval at a time, and every change is rebuilt and replayed by the simulator:

- over the runtime budget: a recomputation becomes a page-in (paged out once where it is already in
  RAM), the one that saves the most runtime per joule it adds first;
- over RAM at a stage: a tensor that idles across it leaves RAM for the idle interval, paged out and
  in or recomputed where next read, or a tensor recomputed in it is paged in instead (its inputs then
  need no RAM there), the most bytes per joule first (a carry that nothing reads later is dropped for
  free); where no single such change lowers the bytes over the budget, a pair of them that does (at a budget
  with no slack, a tensor recomputed in a stage from one kept for the next is paged in instead, and only
  then can the other leave RAM over that stage: the interval relaxation's schedules at the smallest
  footprint; docs/solve.md, NOTE 12);
- within both budgets: a page-in becomes a recomputation, or a recomputation a page-in, wherever that
  is cheaper and both budgets still hold (on the M4 a recomputation costs far less energy than paging,
  up to the runtime budget), the cheapest first, until no single change pays;
- then (``chains``) ejection chains: a regeneration dropped by keeping its tensor in RAM, and RAM made
  again by the over-RAM changes, kept where the chain ends within both budgets at less energy (the
  cheaper schedules of bert/m4 at 50% keep an attention score and recompute cheap tensors more often,
  which no single change reaches; docs/solve.md, NOTE 9).

It finds schedules, not bounds; the caller replays what comes out like every start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import InvalidScheduleError, Schedule, simulate
from poetlab.planners.heuristics import greedy_remat_schedule, stage_recompute

log = logging.getLogger("poetlab.repair")

#: the candidate changes replayed per step before the search gives up on that step (each replay is
#: milliseconds to a few tens of them on the paper graphs)
TRIES_PER_STEP = 25
#: at a local optimum of the single changes: the regenerations tried as "keep it in RAM instead", the
#: most energy saved first, and the over-RAM changes each may take to make room again (:func:`_eject`)
HOLD_TRIES = 40
EJECT_STEPS = 12
#: over RAM where no single change helps: the first changes tried as the first of a pair (:func:`_two_memory_moves`)
PAIR_TRIES = 8


@dataclass(frozen=True)
class Budgets:
    """What a repaired schedule must meet, in the simulator's terms."""

    ram_bytes: float
    runtime_s: float | None = None
    fixed_bytes: int = 0
    count_paging_time: bool = False
    prefetch: bool = False
    paging: bool = True
    remat: bool = True


class _State:
    """A schedule as matrices (R derived), with its energy and runtime kept up to date row by row."""

    def __init__(self, graph: TrainingGraph, costs: CostModel, budgets: Budgets, S_RAM, M_IN, M_OUT):
        self.graph, self.costs, self.budgets = graph, costs, budgets
        T = graph.n_nodes
        self.T = T
        self.inputs = [sorted(set(node.inputs)) for node in graph.nodes]
        self.is_input = np.zeros((T, T), dtype=bool)
        for k, ins in enumerate(self.inputs):
            self.is_input[k, ins] = True
        self.S_RAM, self.M_IN, self.M_OUT = S_RAM.copy(), M_IN.copy(), M_OUT.copy()
        self.R = np.zeros((T, T), dtype=bool)
        self.rerun_energy, self.rerun_time = np.zeros(T), np.zeros(T)  # per stage, kept with R
        self.read_by_reruns = np.zeros((T, T), dtype=bool)  # per stage, the tensors its computations read, kept with R
        self.refresh(range(T))
        seconds = budgets.count_paging_time
        self.paging = [float(M_IN.sum(axis=0) @ costs.pagein_energy_j + M_OUT.sum(axis=0) @ costs.pageout_energy_j),
                       float(M_IN.sum(axis=0) @ costs.pagein_time_s + M_OUT.sum(axis=0) @ costs.pageout_time_s) if seconds else 0.0]

    def copy(self) -> _State:
        other = object.__new__(_State)
        other.__dict__.update(self.__dict__)
        other.S_RAM, other.M_IN, other.M_OUT, other.R = self.S_RAM.copy(), self.M_IN.copy(), self.M_OUT.copy(), self.R.copy()
        other.rerun_energy, other.rerun_time, other.paging = self.rerun_energy.copy(), self.rerun_time.copy(), list(self.paging)
        other.read_by_reruns = self.read_by_reruns.copy()
        return other

    def page(self, kind: str, t: int, j: int, value: bool) -> None:
        """Set M_IN (``kind`` "in") or M_OUT ("out") at stage t for tensor j, keeping the paging cost."""
        matrix = self.M_IN if kind == "in" else self.M_OUT
        if matrix[t, j] == value:
            return
        matrix[t, j] = value
        c = self.costs
        sign = 1.0 if value else -1.0
        self.paging[0] += sign * float((c.pagein_energy_j if kind == "in" else c.pageout_energy_j)[j])
        if self.budgets.count_paging_time:
            self.paging[1] += sign * float((c.pagein_time_s if kind == "in" else c.pageout_time_s)[j])

    def unpage_out(self, j: int) -> None:
        for t in np.flatnonzero(self.M_OUT[:, j]):
            self.page("out", int(t), j, False)

    def refresh(self, stages) -> None:
        for t in sorted(set(int(s) for s in stages if 0 <= s < self.T)):
            r = stage_recompute(self.inputs, self.S_RAM, self.M_IN, t)
            self.R[t] = r
            r[t] = False
            self.rerun_energy[t] = float(self.costs.recompute_energy_j[r].sum())
            self.rerun_time[t] = float(self.costs.recompute_runtime_s[r].sum())
            self.read_by_reruns[t] = self.is_input[self.R[t]].any(axis=0)

    def reads(self, t: int) -> np.ndarray:
        """The tensors a computation of stage t reads, or a page-out of stage t copies."""
        return self.read_by_reruns[t] | self.M_OUT[t]

    def energy_j(self) -> float:
        return self.costs.plain_step_energy_j + float(self.rerun_energy.sum()) + self.paging[0]

    def runtime_s(self) -> float:
        return self.costs.plain_step_runtime_s + float(self.rerun_time.sum()) + self.paging[1]

    def schedule(self) -> Schedule:
        S_SSD = np.zeros_like(self.M_OUT)
        S_SSD[1:] = np.cumsum(self.M_OUT, axis=0)[:-1] > 0
        return Schedule.from_matrices(self.graph, self.R, self.S_RAM, S_SSD, self.M_IN, self.M_OUT, prefetch=self.budgets.prefetch)

    def excess(self) -> tuple[float, np.ndarray] | None:
        """(the bytes over the RAM budget summed over stages, each stage's excess), or None if the
        simulator refuses the schedule for another reason than its budgets."""
        schedule = self.schedule()
        try:
            sim = simulate(schedule, self.graph, self.costs, fixed_bytes=self.budgets.fixed_bytes, count_paging_time=self.budgets.count_paging_time)
        except InvalidScheduleError:
            return None
        stages = np.fromiter((op.stage for op in schedule.ops), dtype=np.int64, count=len(schedule.ops))
        peak = np.zeros(self.T)
        np.maximum.at(peak, stages, sim.memory_trace_bytes.astype(float))
        over = np.maximum(peak - self.budgets.ram_bytes, 0.0)
        return float(over.sum()), over


def _page_in_instead(state: _State, s: int, i: int) -> _State | None:
    """Tensor i, recomputed in stage s, paged in at the end of stage s - 1 instead (paged out once,
    where it is in RAM at a stage start, else right after its computation)."""
    outs = np.flatnonzero(state.M_OUT[:, i])
    new = state.copy()
    touched = [s - 1, s]
    if outs.size == 0 or outs[0] > s - 2:
        if outs.size:
            new.unpage_out(i)
        resident = [o for o in range(i + 1, s - 1) if state.S_RAM[o, i]]
        if resident:
            o = resident[0]
        elif i + 1 <= s - 2:
            o = i + 1
            new.S_RAM[o, i] = True
            touched += [i, i + 1]
        else:
            return None
        new.page("out", o, i, True)
        touched += [o - 1, o]
    new.page("in", s - 1, i, True)
    new.S_RAM[s, i] = True
    new.refresh(touched)
    return new


def _idle_run(state: _State, t: int, j: int) -> tuple[int, int]:
    """The stages around t where j is in RAM at the start and neither read nor paged out."""
    idle = state.S_RAM[:, j] & ~state.read_by_reruns[:, j] & ~state.M_OUT[:, j]
    back = np.flatnonzero(~(idle[:t] & ~state.R[:t, j]))  # going back: stages that hold j, read and recompute nothing of it
    forward = np.flatnonzero(~idle[t + 1 :])
    return (int(back[-1]) + 1 if back.size else 0), (t + int(forward[0]) if forward.size else state.T - 1)


def _relieve(state: _State, t: int, j: int, lever: str) -> _State | None:
    """Tensor j, idle across stage t, out of RAM over its idle run: dropped if nothing reads it after,
    else paged (out at the run's first stage, in at its last) or recomputed where next read."""
    a, b = _idle_run(state, t, j)
    new = state.copy()
    needed_after = b + 1 < state.T and state.S_RAM[b + 1, j]
    if not needed_after:
        if lever != "drop":
            return None
        new.S_RAM[a : b + 1, j] = False
        new.refresh((a - 1, a, b, b + 1))  # (nothing reads j inside its idle run: the rows between keep their recomputations)
        return new
    if lever == "page":
        outs = np.flatnonzero(state.M_OUT[:, j])
        if outs.size and outs[0] < a:
            new.S_RAM[a : b + 1, j] = False
        elif b >= a + 1 and t >= a + 1:
            new.unpage_out(j)
            new.page("out", a, j, True)
            new.S_RAM[a + 1 : b + 1, j] = False
        else:
            return None
        new.page("in", b, j, True)
        new.refresh((a - 1, a, b, b + 1))
        return new
    if lever == "recompute":
        new.S_RAM[a : b + 1, j] = False
        last = b + 1
        if last + 1 < state.T and not state.S_RAM[last + 1, j] and not state.M_OUT[last, j]:
            new.S_RAM[last, j] = False  # only read in stage b + 1: recomputed there
        new.refresh((a - 1, a, b, b + 1, b + 2))
        return new
    return None


def _recompute_instead(state: _State, s: int, j: int) -> _State | None:
    """Tensor j, paged in during stage s, recomputed where it is next read instead (its page-out
    dropped with its last page-in)."""
    u = s + 1
    while u < state.T and state.S_RAM[u, j] and not state.reads(u)[j]:
        u += 1
    if u >= state.T or not state.S_RAM[u, j]:
        return None
    new = state.copy()
    new.page("in", s, j, False)
    new.S_RAM[s + 1 : u, j] = False
    if u + 1 < state.T and not state.S_RAM[u + 1, j] and not state.M_OUT[u, j]:
        new.S_RAM[u, j] = False
    touched = list(range(s, u + 1))
    if not new.M_IN[:, j].any():
        new.unpage_out(j)
    new.refresh(touched)
    return new


def _runtime_moves(state: _State) -> Iterator[_State]:
    movable = ~state.graph.pinned & state.budgets.paging
    moves = []
    for s, i in zip(*np.nonzero(state.R & ~np.eye(state.T, dtype=bool))):
        if movable[i]:
            moves.append((int(s), int(i)))
    scored = []
    runtime, energy = state.runtime_s(), state.energy_j()
    for s, i in moves:
        new = _page_in_instead(state, s, i)
        if new is None:
            continue
        saved = runtime - new.runtime_s()
        if saved > 0:
            scored.append((-saved / max(new.energy_j() - energy, 1e-12 * energy), new))
    for _, new in sorted(scored, key=lambda pair: pair[0]):
        yield new


def _memory_moves(state: _State, over: np.ndarray) -> Iterator[_State]:
    t = int(np.flatnonzero(over > 0)[0])
    reads = state.reads(t)
    energy, runtime = state.energy_j(), state.runtime_s()
    limit = state.budgets.runtime_s
    scored = []
    levers = ["drop"] + (["page"] if state.budgets.paging else []) + (["recompute"] if state.budgets.remat else [])
    for j in np.flatnonzero(state.S_RAM[t] & ~reads & ~state.graph.pinned & (state.graph.output_bytes > 0)):
        for lever in levers:
            new = _relieve(state, t, int(j), lever)
            if new is None:
                continue
            seconds = new.runtime_s()
            if limit is not None and seconds > max(limit, runtime) * (1 + 1e-12):
                continue
            added = new.energy_j() - energy
            scored.append((-state.graph.output_bytes[j] / max(added, 1e-12 * energy), new))
    if state.budgets.paging:  # a recomputation in stage t paged in instead: its chain's inputs need no RAM there
        for i in np.flatnonzero(state.R[t] & ~state.graph.pinned):
            if i != t and (new := _page_in_instead(state, t, int(i))) is not None:
                scored.append((-state.graph.output_bytes[i] / max(new.energy_j() - energy, 1e-12 * energy), new))
    for _, new in sorted(scored, key=lambda pair: pair[0]):
        yield new


def _saving_moves(state: _State) -> Iterator[_State]:
    energy = state.energy_j()
    limit = state.budgets.runtime_s
    scored = []
    candidates = []
    if state.budgets.remat:
        movable = ~state.graph.pinned
        candidates += [_recompute_instead(state, int(s), int(j)) for s, j in zip(*np.nonzero(state.M_IN)) if movable[j]]
    if state.budgets.paging:
        candidates += list(_runtime_moves(state))
    for new in candidates:
        if new is None:
            continue
        saved = energy - new.energy_j()
        if saved > 1e-12 * energy and (limit is None or new.runtime_s() <= limit):
            scored.append((-saved, id(new), new))
    for _, _, new in sorted(scored, key=lambda item: item[:2]):
        yield new


def _hold(state: _State, s: int, j: int) -> _State | None:
    """Tensor j, regenerated for stage s (recomputed in it, or paged in at the end of stage s - 1),
    kept in RAM instead since the last stage before s that has it in RAM (its computation, a read, a
    recomputation or a stage start)."""
    p = s - 1
    while p > j and not (state.S_RAM[p, j] or state.R[p, j]):
        p -= 1
    if p < j or p >= s - 1 and not state.M_IN[s - 1, j]:
        return None
    new = state.copy()
    new.page("in", s - 1, j, False)
    new.S_RAM[p + 1 : s + 1, j] = True
    if not new.M_IN[:, j].any():
        new.unpage_out(j)
    new.refresh(range(p, s + 1))
    return new


def _hold_moves(state: _State) -> Iterator[_State]:
    """Each regeneration (a recomputation, a page-in) replaced by keeping the tensor in RAM since it was
    last there, the most energy saved first: over RAM as they come, for :func:`_eject` to make room."""
    energy = state.energy_j()
    movable = ~state.graph.pinned & (state.graph.output_bytes > 0)
    spots = {(int(s), int(j)) for s, j in zip(*np.nonzero(state.R & ~np.eye(state.T, dtype=bool))) if movable[j]}
    spots |= {(int(s) + 1, int(j)) for s, j in zip(*np.nonzero(state.M_IN)) if movable[j] and s + 1 < state.T}
    scored = []
    for s, j in spots:
        new = _hold(state, s, j)
        if new is not None and energy - new.energy_j() > 1e-12 * energy:
            scored.append((new.energy_j(), s, j, new))
    for *_, new in sorted(scored, key=lambda item: item[:3]):
        yield new


def _eject(state: _State, deadline: float) -> tuple[_State, tuple[float, np.ndarray]] | None:
    """A cheaper schedule within both budgets two or more changes away, or None: a regeneration dropped
    by keeping its tensor in RAM (:func:`_hold_moves`), then RAM made again by the over-RAM changes
    (other tensors out over their idle runs), kept only if the whole chain ends within both budgets at
    less energy. (An ejection chain: on bert/m4 at 50% the cheaper schedules keep an attention score
    and recompute a few cheap tensors more often, which no single change reaches.)"""
    energy, limit = state.energy_j(), state.budgets.runtime_s
    for tried, held in enumerate(_hold_moves(state)):
        if tried >= HOLD_TRIES or time.perf_counter() > deadline:
            return None
        new, measured = held, held.excess()
        for _ in range(EJECT_STEPS):
            if measured is None or measured[0] <= 0 or new.energy_j() >= energy or time.perf_counter() > deadline:
                break
            found = _move_below(new, measured[1], measured[0], deadline)
            if found is None:
                break
            new, measured = found
        if measured is not None and measured[0] <= 0 and new.energy_j() < energy * (1 - 1e-12) and (limit is None or new.runtime_s() <= limit * (1 + 1e-12)):
            return new, measured
    return None


def _two_memory_moves(state: _State, measured: tuple[float, np.ndarray], deadline: float) -> tuple[_State, tuple[float, np.ndarray]] | None:
    """Two over-RAM changes that lower the bytes over the budget together where neither does alone, or None:
    each of the first ``PAIR_TRIES`` changes at the first stage over the budget, then each change at the first
    stage over the budget after it. (At a budget with no slack, a tensor recomputed in a stage from one kept
    for the next stage is paged in instead, and only then can the other tensor leave RAM over that stage.)"""
    for tried, first in enumerate(_memory_moves(state, measured[1])):
        if tried >= PAIR_TRIES or time.perf_counter() > deadline:
            return None
        middle = first.excess()
        if middle is None or middle[0] <= 0:
            continue
        found = _move_below(first, middle[1], measured[0], deadline)
        if found is not None:
            return found
    return None


def _move_below(state: _State, over: np.ndarray, below_bytes: float, deadline: float) -> tuple[_State, tuple[float, np.ndarray]] | None:
    """The first of ``state``'s first ``TRIES_PER_STEP`` over-RAM changes (:func:`_memory_moves` at ``over``, its
    excess's stages) that leaves fewer than ``below_bytes`` over the budget, with its excess; None if none does
    before ``deadline``."""
    for tries, candidate in enumerate(_memory_moves(state, over)):
        if tries >= TRIES_PER_STEP or time.perf_counter() > deadline:
            return None
        after = candidate.excess()
        if after is not None and after[0] < below_bytes:
            return candidate, after
    return None


def repair(graph: TrainingGraph, costs: CostModel, schedule: Schedule, budgets: Budgets, time_limit_s: float = 5.0, chains: bool = True) -> Schedule | None:
    """``schedule`` changed, one tensor interval at a time, until it fits ``budgets`` (first RAM, then
    runtime), then made cheaper while single changes pay and, with ``chains``, while an ejection chain
    (:func:`_eject`) pays, until ``time_limit_s``; None if it cannot be made to fit in ``time_limit_s``
    (or the simulator refuses it for another reason than its budgets). Every accepted step is replayed
    by the simulator; the caller replays the result again like every start."""
    deadline = time.perf_counter() + time_limit_s
    matrices = schedule.matrices()
    T = graph.n_nodes
    S_RAM, M_IN, M_OUT = (np.asarray(getattr(matrices, name)[:T], dtype=bool) for name in ("S_RAM", "M_IN", "M_OUT"))
    if getattr(matrices, "S_CMP") is not None and matrices.S_CMP.any():
        return None
    M_IN = M_IN & np.vstack([S_RAM[1:], np.zeros((1, T), dtype=bool)])  # page-ins the next stage keeps
    state = _State(graph, costs, budgets, S_RAM, M_IN, M_OUT)
    measured = state.excess()
    if measured is None:
        return None
    best: tuple[float, _State] | None = None
    steps = 0
    while True:
        excess, over = measured
        runtime_over = budgets.runtime_s is not None and state.runtime_s() > budgets.runtime_s * (1 + 1e-12)
        if excess <= 0 and not runtime_over and (best is None or state.energy_j() < best[0]):
            best = (state.energy_j(), state)
        if time.perf_counter() > deadline:
            break
        if excess > 0:
            moves = _memory_moves(state, over)
        elif runtime_over:
            moves = _runtime_moves(state)
        else:
            moves = _saving_moves(state)
        accepted = False
        for tries, new in enumerate(moves):
            if tries >= TRIES_PER_STEP or time.perf_counter() > deadline:
                break
            after = new.excess()
            if after is not None and ((excess > 0 and after[0] < excess) or (excess <= 0 and after[0] <= 0)):
                state, measured, accepted = new, after, True
                steps += 1
                break
        if not accepted and excess > 0:  # no single change lowers the bytes over: two that do together
            paired = _two_memory_moves(state, measured, deadline)
            if paired is not None:
                state, measured = paired
                steps += 2
                continue
        if not accepted and chains and excess <= 0 and not runtime_over:
            ejected = _eject(state, deadline)
            if ejected is not None:
                state, measured = ejected
                steps += 1
                continue
        if not accepted:
            break
    if best is None:
        log.info("repair: no schedule within the budgets after %d step(s)", steps)
        return None
    log.info("repair: %d step(s), %.10g J (%.6f x one plain step)", steps, best[0], best[0] / costs.plain_step_energy_j)
    return best[1].schedule()


def loose_starts(graph: TrainingGraph, costs: CostModel, budgets: Budgets, exclude: tuple[str, ...] | list[str] = ()) -> list[Schedule]:
    """Quick schedules planned for the RAM budget alone (DTR, greedy remat), for :func:`repair` to bring
    within the runtime budget: at a tight runtime budget the quick starts that fit page nearly
    everything, while DTR's schedule with a few recomputations paged instead is far cheaper (resnet50/m4 at
    10% and 1.05x: 1.04 plain steps, the starts that fit 1.27). None where there is no runtime budget;
    those named in ``exclude`` (``dtr``, ``greedy_remat``: solve's ``exclude_starts``) left out."""
    from poetlab.planners.baselines import dtr
    from poetlab.planners.baselines.base import Budgets as PlannerBudgets, CannotMeetBudget

    if budgets.runtime_s is None or not budgets.remat:
        return []
    budget = budgets.ram_bytes - budgets.fixed_bytes + graph.reserved_bytes  # the planners' budget (solve's best_start)
    out = []
    planners = {"dtr": lambda: dtr.plan(graph, costs, PlannerBudgets(budget, None)), "greedy_remat": lambda: greedy_remat_schedule(graph, costs, budget, None)}
    for name, make in planners.items():
        if name in exclude:
            continue
        try:
            schedule = make()
        except CannotMeetBudget:
            continue
        if schedule is not None:
            out.append(schedule)
    return out


def repair_all(graph: TrainingGraph, costs: CostModel, schedules: list[Schedule], budgets: Budgets, time_limit_s: float, chains: bool = True) -> list[Schedule]:
    """:func:`repair` of each of ``schedules``, cheapest first (replayed without budgets: a cheap
    schedule a little over a budget is the likeliest to stay cheap once it fits), each within half of
    what is left of ``time_limit_s`` (or its equal share, if more); those it could bring within the
    budgets. (On resnet50/m4 at 10% and 1.05x, DTR's schedule for RAM alone, the cheapest, fits after
    four changes in 0.3 s; greedy remat's or the cover's need seconds.) Among equally cheap ones the one
    given last comes first: a relaxation's schedule made from a start's point replays at the start's energy
    but frees what the start held needlessly, and the chains go further from it (NOTE 33: on the grid's
    resnet50/m4/0.1/1.05x, 1.024868 plain steps in 3 s, where the settled point's own schedule stops at
    1.0331 after 12 s). ``chains``: as :func:`repair`'s (with them each repair runs until its share is
    spent while chains keep paying)."""
    deadline = time.perf_counter() + time_limit_s
    priced = []
    for schedule in schedules:
        try:
            priced.append((simulate(schedule, graph, costs, fixed_bytes=budgets.fixed_bytes).energy_j, -len(priced), schedule))  # (ties: the last given first)
        except InvalidScheduleError:
            continue
    out = []
    for number, (_, _, schedule) in enumerate(sorted(priced, key=lambda item: item[:2])):
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        repaired = repair(graph, costs, schedule, budgets, time_limit_s=left * max(0.5, 1 / (len(priced) - number)), chains=chains)
        if repaired is not None:
            out.append(repaired)
    return out

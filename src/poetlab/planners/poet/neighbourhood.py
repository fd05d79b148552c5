"""Better schedules by re-solving POET's MILP a few tensors at a time (large-neighbourhood search).

On the M4, HiGHS does not improve the quick starts inside POET's whole MILP (66k-424k columns, most of
them FREE and U) within a minute, while the optimum can be a few percent below them (docs/solve.md,
NOTE 4). A window is a handful of tensors: every column of POET's MILP that is about another tensor
(its R, S_RAM, S_SSD, M_IN, M_OUT in every stage, and the FREE columns of edges that touch none of the
window's tensors) is fixed at the incumbent's value (the incumbent encoded by
:meth:`~poetlab.planners.poet.milp.MilpModel.encode`) and dropped, its contribution moved into the rows'
bounds; the U columns stay free. HiGHS solves what is left, from the incumbent, in about a second. Any
solution of a window's problem is, with the fixed columns, a solution of POET's MILP, so the result is
a schedule of the same formulation, never more expensive than the incumbent; it is replayed by the
simulator like every start, and kept only if it fits and is cheaper. Windows (8 tensors, overlapping
by half, among those the budget cannot hold across some stage) are solved last to first, pass after
pass, from each seed in turn. This finds schedules, not bounds: it proves nothing about the optimum.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp

from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.bounds import eviction_demands
from poetlab.planners.poet.milp import MilpModel

log = logging.getLogger("poetlab.neighbourhood")

#: the tensors re-decided at once (8 did better than 12 and 16 on Fig. 4's case; docs/solve.md, NOTE 4)
WINDOW_TENSORS = 8
#: the most time one window's solve may take (most end in about a second; the first tensors' window,
#: whose tensors live through the whole step, can take several, and on Fig. 4's case it holds the gain:
#: with 2 s it was stopped before finding it, at load 9), and its share of the search's time
WINDOW_TIME_LIMIT_S = 6.0
WINDOW_SHARE = 1 / 6


def column_tensors(model: MilpModel) -> tuple[np.ndarray, np.ndarray]:
    """(the tensor of each column, or -1 for U; the other end of a FREE column's edge, or -1)."""
    tensor = np.full(model.n_cols, -1, dtype=np.int64)
    other = np.full(model.n_cols, -1, dtype=np.int64)
    for idx in model.index.values():
        t, i = np.nonzero(idx >= 0)
        tensor[idx[t, i]] = i
    t, e = np.nonzero(model.free_index >= 0)
    tensor[model.free_index[t, e]] = model.edges[e, 0]
    other[model.free_index[t, e]] = model.edges[e, 1]
    return tensor, other


def fits_milp(model: MilpModel, schedule: Schedule, tolerance: float = 1e-6) -> bool:
    """Whether ``schedule``, encoded, is a solution of ``model``. The simulator accepts some schedules
    that POET's MILP cannot express (DTR's, which frees tensors where the MILP holds them to the end of
    a stage), and a window search must start from a solution of the MILP: with such a start, every
    window that does not contain the stage over the MILP's budget is infeasible."""
    try:
        x = model.encode(schedule.matrices().as_dict())
    except (KeyError, ValueError, IndexError):
        return False
    activity = model.A @ x

    def within(value, lower, upper) -> bool:  # bounds met to ``tolerance`` relative to their size
        with np.errstate(invalid="ignore"):
            return bool(np.all(value >= lower - tolerance * (1 + np.abs(lower))) and np.all(value <= upper + tolerance * (1 + np.abs(upper))))

    return within(activity, model.row_lower, model.row_upper) and within(x, model.col_lower, model.col_upper)


def milp_form(graph: TrainingGraph, schedule: Schedule, prefetch: bool = False) -> Schedule:
    """``schedule`` with every carry that its stage neither reads, pages out nor keeps for the next stage
    dropped (freed at the end of the stage before), rebuilt from its matrices: the same computations and
    paging, so the same energy, in the MILP's accounting. DTR, for one, frees a tensor at the start of
    the stage after its last use, which the MILP counts as held through that stage's start; moved one
    stage earlier, such a free is one the MILP can express. The caller replays the result."""
    matrices = schedule.matrices().as_dict()
    R, S_RAM, M_OUT = (np.asarray(matrices[name], dtype=bool) for name in ("R", "S_RAM", "M_OUT"))
    S_RAM = S_RAM.copy()
    T = graph.n_nodes
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    for t in range(T - 1, -1, -1):
        needed = (S_RAM[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)) | M_OUT[t]
        needed[[u for k in np.flatnonzero(R[t]) for u in inputs[k]]] = True
        S_RAM[t] &= needed
    return Schedule.from_matrices(graph, R, S_RAM, matrices["S_SSD"], matrices["M_IN"], M_OUT, prefetch=prefetch)


def window_model(model: MilpModel, x: np.ndarray, free: np.ndarray) -> tuple[MilpModel, np.ndarray]:
    """POET's MILP with every column outside ``free`` (a boolean mask) fixed at ``x``: (the smaller
    model, the columns it keeps). Its last column, fixed at 1, carries the fixed columns' cost, so its
    objective is the whole schedule's energy."""
    cols = np.flatnonzero(free)
    A = model.A.tocsc()
    fixed_activity = A[:, ~free] @ x[~free]
    sub = A[:, cols].tocsr()
    rows = np.flatnonzero(np.diff(sub.indptr) > 0)
    sub = sub[rows]
    constant = float(model.c[~free] @ x[~free])
    # MilpModel.energy_scale (the backends' unit) reads the cost of the "R" diagonal: the kept columns
    # of the diagonal there, and the constant column in a slot whose column is fixed (its cost is in it)
    T = model.index["R"].shape[0]
    diagonal = np.diagonal(model.index["R"])
    new = np.full(model.n_cols, -1, dtype=np.int64)
    new[cols] = np.arange(cols.size)
    plain = np.full((T, T), -1, dtype=np.int64)
    slots = np.arange(T)[diagonal >= 0]
    plain[slots, slots] = new[diagonal[slots]]
    fixed_slots = slots[plain[slots, slots] < 0]
    if fixed_slots.size:
        plain[fixed_slots[0], fixed_slots[0]] = cols.size
    small = MilpModel(
        c=np.append(model.c[cols], constant), A=sp.hstack([sub, sp.csr_matrix((rows.size, 1))]).tocsr(),
        row_lower=model.row_lower[rows] - fixed_activity[rows], row_upper=model.row_upper[rows] - fixed_activity[rows],
        col_lower=np.append(model.col_lower[cols], 1.0), col_upper=np.append(model.col_upper[cols], 1.0),
        integer=np.append(model.integer[cols], True), index={"R": plain}, free_index=np.zeros((T, 0), dtype=np.int64),
        u_index=np.zeros((T, 0), dtype=np.int64), edges=np.zeros((0, 2), dtype=np.int64), node_bytes=model.node_bytes,
    )
    return small, cols


def tensor_windows(graph: TrainingGraph, model: MilpModel, window: int) -> list[np.ndarray]:
    """The windows of a pass: ``window`` consecutive tensors at a time, overlapping by half, among those
    the budget cannot hold across some stage (:func:`~poetlab.planners.poet.bounds.eviction_demands`:
    only their eviction can be needed; on the paper graphs the forward pass's outputs, about half of
    the tensors); every tensor where no stage is over the budget."""
    # the U columns' upper bound is the RAM budget (a model without them has none: every tensor is a candidate)
    bytes_upper = model.col_upper[model.u_index[model.u_index >= 0]]
    budget = float(np.max(bytes_upper)) if bytes_upper.size else np.inf
    demands = eviction_demands(graph, budget) if np.isfinite(budget) else []
    candidates = np.unique(np.concatenate([live for _, live, _ in demands])) if demands else np.arange(graph.n_nodes)
    step = max(1, window // 2)
    # last to first: on Fig. 4's case the first tensors' window gains most once the later windows have
    # freed runtime slack (certified in 33 s where first to last took 42 s, same seed, load 8.5)
    return [candidates[a : a + window] for a in range(0, max(1, candidates.size - window // 2), step)][::-1]


#: a pass over the windows that gains less than this (relative) ends the search from its seed: the next
#: seed gets the time left (on Fig. 4's case DTR's schedule is a local optimum 2.9% above the optimum's
#: basin, which the search reaches from greedy remat's, 4.3% above it)
MIN_PASS_GAIN = 1e-4


def improve(
    graph: TrainingGraph,
    model: MilpModel,
    seeds: Sequence[tuple[Schedule, SimulationResult]],
    replay: Callable[[Schedule], SimulationResult],
    time_limit_s: float,
    target_j: float = 0.0,
    window: int = WINDOW_TENSORS,
    window_time_limit_s: float | None = None,
    prefetch: bool = False,
) -> tuple[Schedule, SimulationResult]:
    """The cheapest schedule found by re-solving windows of ``window`` tensors of ``model``, from each
    of ``seeds`` in turn (schedules with their simulations; each must replay within the budgets and be
    a solution of ``model``: :func:`fits_milp`) until a pass from it gains less than ``MIN_PASS_GAIN``,
    within ``time_limit_s`` in all; the cheapest seed if nothing is cheaper. Stops once a schedule
    costs at most ``target_j`` (the caller's proven bound within its gap). Each window's problem is
    solved by HiGHS in its worker from the incumbent, so it never returns worse than that."""
    deadline = time.perf_counter() + time_limit_s
    if window_time_limit_s is None:
        window_time_limit_s = max(1.0, min(WINDOW_TIME_LIMIT_S, WINDOW_SHARE * time_limit_s))
    tensor, other = column_tensors(model)
    best, best_sim = min(seeds, key=lambda pair: pair[1].energy_j)
    windows = tensor_windows(graph, model, window)
    for number, (current, current_sim) in enumerate(seeds):
        x = model.encode(current.matrices().as_dict())
        passes, gain = 0, 1.0
        while gain >= MIN_PASS_GAIN:
            passes += 1
            before = current_sim.energy_j
            for chosen in windows:
                left = deadline - time.perf_counter()
                if left < 0.5 or best_sim.energy_j <= target_j:
                    log.info("window search: %s, %.10g J", "time limit" if left < 0.5 else "within the gap of the bound", best_sim.energy_j)
                    return best, best_sim
                small, cols = window_model(model, x, (tensor < 0) | np.isin(tensor, chosen) | np.isin(other, chosen))
                answer = run_milp(small, solver="highs", time_limit_s=min(left, window_time_limit_s), mip_gap=1e-4, threads=1, start=np.append(x[cols], 1.0))
                if answer.x is None or answer.objective is None or answer.objective >= current_sim.energy_j * (1 - 1e-9):
                    continue
                y = x.copy()
                y[cols] = np.asarray(answer.x)[:-1]
                schedule = Schedule.from_matrices(graph, prefetch=prefetch, **model.decode(y))
                try:
                    sim = replay(schedule)
                except InvalidScheduleError as exc:
                    log.info("window %s: its schedule does not replay (%s)", chosen, exc)
                    continue
                if sim.energy_j < current_sim.energy_j:
                    log.debug("seed %d, window %s: %.10g J (was %.10g J)", number, chosen, sim.energy_j, current_sim.energy_j)
                    current, current_sim = schedule, sim
                    x = model.encode(schedule.matrices().as_dict())
                    if sim.energy_j < best_sim.energy_j:
                        best, best_sim = schedule, sim
            gain = (before - current_sim.energy_j) / before
        log.info("window search from seed %d: %d pass(es), %.10g J", number, passes, current_sim.energy_j)
    return best, best_sim

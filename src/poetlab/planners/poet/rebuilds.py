"""The rebuild bound: the eviction bound with the backward pass's rebuilds and their inputs charged at a few stages
(NOTE 23 in docs/solve.md).

The eviction bound (:mod:`poetlab.planners.poet.bounds`, NOTE 2) charges a tensor evicted across a stage its own
rerun, once, although a rerun needs its inputs in RAM at that moment, and theirs, down to tensors still held; on a
chain of skip-adds (BERT) a held checkpoint below it or a sweep from the input, and a tensor rebuilt and dropped
again is rebuilt again. This bound follows the tensors before the first chosen stage t_1 (the block: those read
after t_1 and what they are computed from) through the chosen stages t_1 < ... < t_K of the backward pass, each
interval (t_k, t_k+1] (the last to the end) with three binaries per block tensor a:

- ``h[k, a]``: a is in RAM when node t_k runs and at the start of stage t_k + 1 (S_RAM[t_k+1, a], and S_RAM[t_k, a]
  or R[t_k, a]): nothing frees a tensor kept for the next stage, so these are in RAM beside node t_k's output and
  inputs, as are the live-across tensors outside the block that are never regenerated (NOTE 2's row, with the
  held block tensors in it);
- ``r[k, a]``: a is recomputed in a stage of (t_k, t_k+1];
- ``p[k, a]``: a is paged in in a stage of [t_k, t_k+1).

Rows (each follows from POET's MILP: (1) a node's inputs in RAM, (3) S_RAM[t+1] <= S_RAM[t] + R[t] + M_IN[t]):
a block tensor that a node of (t_k, t_k+1] reads is present: h + r + p >= 1 (follow its presence back to stage
t_k + 1); a rerun in the interval has each input present: h[k, i] + r[k, i] + p[k, i] >= r[k, a]; what is held
across t_k was held across t_k-1, rebuilt or paged in since: h[k, a] <= h[k-1, a] + r[k-1, a] + p[k-1, a]. Node
t_k and its inputs are in RAM at node t_k anyway, so rows that reach them are left out, as are pinned tensors. The
intervals are disjoint, so each rerun and page-in is charged once per interval it falls in (w, v: before t_1); the
cover's x, y (recomputed, paged in at least once) stay for its rows of the other stages, with x <= w + sum r,
y <= v + sum p, p <= y (one page-out at least). Every schedule maps to a point at no more than its energy and
runtime, so the minimum is a lower bound, and never below the eviction bound.

Where two chosen stages follow each other (t_k-1 = t_k - 1), what is in RAM at stage t_k is known: a tensor held
across t_k-1, paged in at t_k-1 or rerun at t_k. Such a tensor read again at stage t_k + 1 (by node t_k + 1, or by a
rerun there where t_k+1 = t_k + 1 is chosen too) is held across t_k or rerun at t_k + 1: POET's matrices cannot free
it in stage t_k and page it in again for the next (a tensor kept for the next stage is not freed in this one), which
interval k's rows alone allow, since a page-in in stage t_k is not in RAM at node t_k. (A page-in with nothing kept
after it does nothing, so a schedule without such page-ins maps to its point.) On resnet50/m4 at its smallest
footprint the point paged layer 1's convolutions in that way around its stages of no room (NOTE 35).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.bounds import COVER_GAP, CoverProblem, cover_problem, last_uses, live_across, proven_extra
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.rows import SparseRows

log = logging.getLogger("poetlab.bounds")

#: every how many stages over budget (from the backward pass's tightest on) get the rebuild rows, and at most how
#: many: each adds three binaries per block tensor; 8 is a BERT layer, and 12 of them span its backward pass (NOTE 23)
REBUILD_STEP, REBUILD_MAX_STAGES = 8, 12
#: how many of the backward pass's stages over budget with the least room get the rebuild rows in
#: :func:`tight_stages`, each with its neighbours (NOTE 28: on resnet50 at its smallest footprint the six stages of
#: layer 1's backward pass where nothing but the node fits)
TIGHT_STAGES = 6


@dataclass(frozen=True)
class RebuildBound:
    """The rebuild bound (J; one plain step where nothing is proven), the stages that got the rows, and its best
    point's choice per tensor: recomputed at least once, paged in at least once (None without a point). The point
    made a schedule and its chain re-planned is a start (NOTE 23: it holds the layers' linears, not the skip-adds).
    ``block`` and ``held``, ``rerun``, ``paged`` (one row per stage, one column per block tensor: h, r, p of the
    module docstring) are the point's choices per interval, which :mod:`poetlab.planners.poet.rebuild_rounds` makes
    a schedule of (NOTE 27); ``optimal``: HiGHS proved the point optimal; ``point_j``: the point's own value (J), which
    a solve stopped at its time limit leaves above the bound (NOTE 29 makes a schedule of a point near it)."""

    bound_j: float
    stages: tuple[int, ...] = ()
    seconds: float = 0.0
    recompute: np.ndarray | None = None
    page: np.ndarray | None = None
    block: np.ndarray | None = None
    held: np.ndarray | None = None
    rerun: np.ndarray | None = None
    paged: np.ndarray | None = None
    optimal: bool = False
    point_j: float | None = None


def _ancestors(graph: TrainingGraph, targets: np.ndarray, below: int) -> np.ndarray:
    """The tensors before ``below`` that ``targets`` are computed from (themselves included)."""
    seen = np.zeros(graph.n_nodes, dtype=bool)
    stack = [int(j) for j in targets]
    seen[targets] = True
    while stack:
        for i in graph.nodes[stack.pop()].inputs:
            if i < below and not seen[i]:
                seen[i] = True
                stack.append(i)
    return np.flatnonzero(seen)


def _free(graph: TrainingGraph, t: int) -> np.ndarray:
    """Per tensor, whether it is in RAM when node t runs whatever the schedule: node t and its inputs (their
    bytes are taken off the room), and the pinned tensors (never evicted)."""
    free = graph.pinned.copy()
    free[t] = True
    free[list(graph.nodes[t].inputs)] = True
    return free


def default_stages(graph: TrainingGraph, demands: list) -> list[int]:
    """The stages over budget from the backward pass's tightest one (the most bytes over its room) on, every
    ``REBUILD_STEP``-th, at most ``REBUILD_MAX_STAGES``: on BERT a backward stage of each layer (NOTE 23)."""
    backward = graph.backward_indices
    b = graph.output_bytes_least
    over = [(t, b[live].sum() - room) for t, live, room in demands if backward and t >= min(backward)]
    if not over:
        return []
    tightest = max(range(len(over)), key=lambda k: over[k][1])
    return [t for t, _ in over[tightest::REBUILD_STEP]][:REBUILD_MAX_STAGES]


def tight_stages(graph: TrainingGraph, demands: list) -> list[int]:
    """The ``TIGHT_STAGES`` stages over budget of the backward pass with the least room (the budget less the node's
    output and inputs; the latest first among equals), each with the stages over budget just before and after it.
    Where a stage leaves no room, every tensor read after it is rebuilt or paged in after it, with its inputs: on
    resnet50/jetsontx2 at its smallest footprint these 12 stages give 1.003302 plain steps in 0.5 s, where the
    default stages (:func:`default_stages`, from the stage most bytes over) give the eviction bound's 1.002785 (NOTE 28)."""
    backward = graph.backward_indices
    if not backward:
        return []
    rooms = {t: room for t, _, room in demands if t >= min(backward)}
    least = sorted(rooms, key=lambda t: (rooms[t], -t))[:TIGHT_STAGES]
    return sorted({s for t in least for s in (t - 1, t, t + 1) if s in rooms})


def rebuild_bound(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0,
    stages: Sequence[int] | Callable[[TrainingGraph, list], list[int]] = default_stages, problem: CoverProblem | None = None,
) -> RebuildBound:
    """A lower bound (J) on the energy of every schedule meeting ``options``' budgets: the eviction bound's
    covering problem with the rebuild rows (module docstring) at ``stages``, given or picked from the stages over
    budget (:func:`default_stages`, :func:`tight_stages`; any stages give a valid bound). ``problem``: the covering
    problem (:func:`~poetlab.planners.poet.bounds.cover_problem`) where the caller built it for several stage sets
    (0.18 s each on resnet50). One plain step where nothing is proven (compression, no stage over budget, no answer)."""
    started = time.perf_counter()
    trivial = costs.plain_step_energy_j
    if problem is None and not options.compression:
        problem = cover_problem(graph, costs, options)
    if callable(stages):
        stages = stages(graph, problem.demands) if problem is not None else []
    stages = sorted(set(stages))
    if problem is None or not stages:
        return RebuildBound(trivial)
    from scipy.optimize import Bounds, LinearConstraint, milp

    T, K, t1 = graph.n_nodes, len(stages), stages[0]
    b = graph.output_bytes_least.astype(float)
    last_use = last_uses(graph)
    targets = np.flatnonzero(last_use[:t1] > t1)
    block = _ancestors(graph, targets, t1)
    block = block[~graph.pinned[block]]
    n = block.size
    in_block = np.zeros(T, dtype=bool)
    in_block[block] = True
    # columns: x (T), y (T) of the cover; w, v (recomputed, paged in before t1: n each); h, r, p per stage (3n each)
    W, V = 2 * T, 2 * T + n
    H = [2 * T + 2 * n + 3 * n * k for k in range(K)]
    R, P = [h + n for h in H], [h + 2 * n for h in H]
    n_cols = 2 * T + 2 * n + 3 * n * K
    plain = costs.plain_step_energy_j
    e, pin, pout = costs.recompute_energy_j[block] / plain, costs.pagein_energy_j[block] / plain, costs.pageout_energy_j[block] / plain
    cost = np.concatenate([problem.cost, e, pin, np.tile(np.concatenate([np.zeros(n), e, pin]), K)])
    cost[block], cost[T + block] = 0.0, pout  # a block tensor's reruns and page-ins are counted per interval
    remat, paging = problem.upper[block], problem.upper[T + block]
    upper = np.concatenate([problem.upper, remat, paging, np.tile(np.concatenate([np.ones(n), remat, paging]), K)])
    constraints = [LinearConstraint(sp.hstack([c.A, sp.csr_matrix((c.A.shape[0], n_cols - 2 * T))]).tocsr(), c.lb, c.ub) for c in problem.constraints]
    rows = SparseRows()
    idx = np.arange(n)
    for q, a in enumerate(block):  # x <= w + sum r, y <= v + sum p, p <= y
        rows.row([a, W + q, *[R[k] + q for k in range(K)]], [1.0, -1.0, *[-1.0] * K], -np.inf, 0.0)
        rows.row([T + a, V + q, *[P[k] + q for k in range(K)]], [1.0, -1.0, *[-1.0] * K], -np.inf, 0.0)
        for k in range(K):
            rows.row([P[k] + q, T + a], [1.0, -1.0], -np.inf, 0.0)
    if options.runtime_budget_factor is not None:
        slack = (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s
        rt = costs.recompute_runtime_s[block]
        pt = costs.pagein_time_s[block] if options.count_paging_time else np.zeros(n)
        outside = np.flatnonzero(~in_block)
        cols = [*outside, *(T + outside), *(W + idx), *(V + idx), *[c for k in range(K) for c in (R[k] + idx)], *[c for k in range(K) for c in (P[k] + idx)]]
        page_out = (costs.pagein_time_s + costs.pageout_time_s)[outside] if options.count_paging_time else np.zeros(outside.size)
        coefs = [*costs.recompute_runtime_s[outside], *page_out, *rt, *pt, *np.tile(rt, K), *np.tile(pt, K)]
        if options.count_paging_time:
            cols, coefs = cols + list(T + block), coefs + list(costs.pageout_time_s[block])
        rows.row(cols, coefs, -np.inf, slack)
    ends = [*stages[1:], T]
    for k, t in enumerate(stages):
        _stage_rows(graph, rows, k, t, stages[k - 1] if k else None, ends[k], block, in_block, problem.budget_bytes, H, R, P, last_use, options.paging)
    constraints.append(LinearConstraint(rows.matrix(n_cols), rows.lower, rows.upper))
    result = milp(cost, constraints=constraints, integrality=np.ones(n_cols), bounds=Bounds(0.0, upper), options={"time_limit": time_limit_s, "mip_rel_gap": COVER_GAP})
    seconds = time.perf_counter() - started
    extra = None if result.status == 2 else proven_extra(result, COVER_GAP)
    bound = trivial if extra is None else trivial * (1.0 + max(0.0, extra))
    point_j = trivial * (1.0 + float(result.fun)) if result.x is not None and result.fun is not None else None
    log.info(
        "rebuild bound: %.10g J (%.6f x one plain step; %d stages from %d, %d columns, %.2f s; its point %s)", bound, bound / trivial, K, t1,
        n_cols, seconds, "none" if point_j is None else f"{point_j / trivial:.6f}",
    )
    if result.x is None:
        return RebuildBound(bound, tuple(stages), seconds)
    chosen = np.asarray(result.x).round().astype(bool)
    recompute = chosen[:T].copy()
    per_stage = chosen[H[0] : H[0] + 3 * n * K].reshape(K, 3, n)
    recompute[block] |= chosen[W : W + n] | per_stage[:, 1].any(axis=0)
    held, rerun, paged = per_stage[:, 0], per_stage[:, 1], per_stage[:, 2]
    return RebuildBound(bound, tuple(stages), seconds, recompute, chosen[T : 2 * T], block, held, rerun, paged, result.status == 0, point_j)


def _stage_rows(graph: TrainingGraph, rows: SparseRows, k: int, t: int, prev: int | None, end: int, block: np.ndarray, in_block: np.ndarray, budget: float, H, R, P, last_use, paging: bool) -> None:
    """Stage t's rows (the k-th chosen; the next is ``end``): its memory, what is held across it carried from the
    stage before, each block tensor read in (t, end] present, each rerun in (t, end] with its inputs present."""
    T, n = graph.n_nodes, block.size
    b = graph.output_bytes_least.astype(float)
    free = _free(graph, t)
    pos = np.full(T, -1)
    pos[block] = np.arange(n)
    live, room = live_across(graph, t, budget, last_use)
    held = block[~free[block]]
    outside = live[~in_block[live]]
    movable = outside[~graph.pinned[outside]]
    # held block tensors + live tensors outside the block not regenerated <= room
    rows.row([*(H[k] + pos[held]), *movable, *(T + movable)], [*b[held], *(-b[movable]), *(-b[movable])], -np.inf, room - b[outside].sum())
    before = None if prev is None else _free(graph, prev)
    for q, a in enumerate(block):
        if free[a]:
            continue
        if before is not None and not before[a]:  # held across t: held across the stage before, or back since
            rows.row([H[k] + q, H[k - 1] + q, R[k - 1] + q, P[k - 1] + q], [1.0, -1.0, -1.0, -1.0], -np.inf, 0.0)
        present = [H[k] + q, R[k] + q, P[k] + q]
        if any(t < u <= end for u in graph.consumers[a]):
            rows.row(present, [1.0, 1.0, 1.0], 1.0, np.inf)
        for i in sorted(set(graph.nodes[a].inputs)):
            if in_block[i] and not free[i]:
                rows.row([H[k] + pos[i], R[k] + pos[i], P[k] + pos[i], R[k] + q], [1.0, 1.0, 1.0, -1.0], 0.0, np.inf)
    if paging and prev == t - 1:  # (without paging no tensor is paged in again: the rows cut no schedule, and on
        # Fig. 4's remat-only resnet18_cifar/m4/0.2/1.02x they moved the round's point off the one whose schedule fits)
        _adjacent_rows(graph, rows, k, t, end, block, in_block, free, pos, H, R, P)


def _adjacent_rows(graph: TrainingGraph, rows: SparseRows, k: int, t: int, end: int, block: np.ndarray, in_block: np.ndarray, free: np.ndarray, pos: np.ndarray, H, R, P) -> None:
    """Where the stage before t is chosen too, what is in RAM at stage t is known: a block tensor held across t - 1,
    paged in at t - 1 or rerun at t (h, p, r of interval k - 1). Such a tensor in RAM at stage t and read at stage
    t + 1 (by node t + 1, or, where t + 1 is chosen too, by a rerun there) is held across t or rerun at t + 1: POET's
    matrices cannot free it in stage t and page it in again for t + 1 (a tensor kept for the next stage is not freed
    in this one, NOTE 35), which the rows of interval k alone allow (a page-in there, not counted at node t)."""
    readers_next = set(graph.nodes[t + 1].inputs) if t + 1 < graph.n_nodes else set()
    for q, a in enumerate(block):
        if free[a]:
            continue
        present = [H[k - 1] + q, R[k - 1] + q, P[k - 1] + q]
        kept = [H[k] + q, R[k] + q]
        if a in readers_next:
            for z in present:
                rows.row([z, *kept], [1.0, -1.0, -1.0], -np.inf, 0.0)
        elif end == t + 1:
            for c in sorted({int(c) for c in graph.consumers[a] if in_block[c]}):
                for z in present:
                    rows.row([z, R[k] + pos[c], *kept], [1.0, 1.0, -1.0, -1.0], -np.inf, 1.0)

"""The interval relaxation split at a cut vertex, its coupling memory rows priced by its LP's duals (a Lagrangian
bound), and the part before the cut split into buckets by the bytes it holds at a stage (NOTE 24, 26, 30 and 34 in
docs/solve.md).

Where the interval relaxation's own bound stalls short of a schedule that is already near it (Fig. 3's
resnet18_cifar/m4/0/2x: HiGHS's root 1.3593 plain steps, the schedule 1.3685, the optimum within 0.025% of it), the
relaxation is split: every column belongs to one tensor (O, H, RC, PG and its idle-gap columns), group A is the
tensors up to a cut vertex, group B the rest. Why the bound is valid, step by step:

1. *Projection.* Each row l <= a_A x_A + a_B x_B <= u is replaced, for group G, by its projection: the other group's
   least and greatest value over its columns' bounds (0 .. upper) moved into the row's bounds. Every point of the
   relaxation meets both projections, so the product of the two projected sets contains the relaxation.
2. *Pricing.* The memory rows that both groups enter (m(x) <= room) are also priced with lambda >= 0 (the whole LP's
   duals): for a point x of the relaxation, lambda . (m(x) - room) <= 0, so c x >= c x + lambda . (m(x) - room). The
   minimum of the right side over the product set is the sum of each group's priced minimum, less lambda . room:
   L(lambda) = min_A + min_B - lambda . room <= the relaxation's optimum, for any lambda >= 0.
3. *Buckets.* min_A is proven as the least bound over a cover of A's points: a bucket fixes a range of the bytes A
   holds at one row stage (the A part of that stage's memory row, E = sum b_j H[j, a]). The ranges [k s, (k+1) s - 1]
   (s the largest tensor in E, bytes and H integral: E takes integer values) for k = 0 .. cover every value E can take
   (0 .. min(sum b_j, the row's room)), so every point of A's part lies in some bucket, and the least of the buckets'
   proven bounds bounds min_A. A bucket split again (by the next stage) is covered by its own sub-buckets the same way;
   an infeasible bucket holds no point. Each part's stopped dual bound, less HiGHS's absolute gap (1e-6), is a bound on
   it; a bucket not solved in time counts with its parent's bound (valid for every sub-bucket).

So 1 + L is a lower bound on the relaxation's optimum, hence on POET's (NOTE 5, 7, 8). The rules (NOTE 30), all read off
the instance: the split is the last cut vertex whose output is the largest among the cut vertices' (the end of the
largest activations, where the relaxation's hard holdings sit); the first bucket stage is the coupling row with the
largest dual; the second is the first row stage after the coupled ones that A's tensors enter. A bucket is tried for a
few seconds and split by the next stage only where that try does not reach its target; the last level runs to the end.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph, cut_vertices
from poetlab.planners.poet.intervals import highs_model, interval_problem, solve_highspy
from poetlab.planners.poet.milp import MilpOptions

log = logging.getLogger("poetlab.bounds")

#: taken off each part's dual bound: HiGHS's absolute gap (what a stopped bound may overstate, NOTE 24)
SAFETY = 1e-6
#: a bucket that is split further is first tried this long (NOTE 30: the buckets that pass their target take about
#: 1-1.5 s on resnet18_cifar/m4/0/2x under load; the ones that do not take 20-80 s unsplit)
TRY_S = 4.0
#: what each bucket still waiting is left at least when a last-level bucket takes the time left
LEAF_MIN_S = 2.0
#: part B (after the cut) gets this share of the phase, at most this many seconds (its root's bound, what it proves in
#: minutes too: 0.3-1 s on resnet18_cifar/m4/0/2x, at load 5 about 1 s)
B_SHARE, B_MAX_S = 0.05, 3.0


@dataclass(frozen=True)
class SplitBound:
    """The bound proven (J; None where nothing was), the cut vertex, how many memory rows were priced, how many
    buckets were solved, whether each bucket reached the caller's target or its optimum, the seconds taken, and the
    row stages whose bytes made the buckets."""

    bound_j: float | None
    split: int | None
    priced: int
    buckets: int
    reached: bool
    seconds: float
    stages: tuple[int, ...] = ()


def split_vertex(graph: TrainingGraph) -> int | None:
    """The last cut vertex whose output is the largest among the cut vertices' outputs (NOTE 30's rule: 22 on
    resnet18_cifar, where its 64 KiB activations end); None without a cut vertex before the last forward node."""
    forward = graph.forward_indices
    cuts = [v for v in cut_vertices(graph) if v != forward[-1]]
    if not cuts:
        return None
    sizes = graph.output_bytes[cuts]
    return int([v for v, size in zip(cuts, sizes) if size == sizes.max()][-1])


def column_tensors(graph: TrainingGraph, problem) -> np.ndarray:
    """The tensor each column of the relaxation speaks of: O[j] is column j; per row stage the H, RC and PG blocks of its
    tracked tensors; the idle-gap columns ZR, ZP (the last) their gap's tensor."""
    owner = np.full(problem.cost.size, -1, dtype=np.int64)
    owner[: graph.n_nodes] = np.arange(graph.n_nodes)
    for a, X in enumerate(problem.tracked):
        for j in X:
            h = problem.H[a][j]
            owner[[h, h + len(X), h + 2 * len(X)]] = j
    if problem.gaps:
        n_gaps = len(problem.gaps)
        first = problem.cost.size - 2 * n_gaps
        for g, (j, _) in enumerate(problem.gaps):
            owner[[first + g, first + n_gaps + g]] = j
    assert (owner >= 0).all(), "a column of the interval relaxation without its tensor"
    return owner


def lp_duals(problem, time_limit_s: float) -> np.ndarray | None:
    """The duals of the relaxation's LP on its rows (the runtime row's left out), or None where HiGHS did not solve it."""
    import highspy

    h = highs_model(problem, False, time_limit_s, 0.0)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return np.asarray(h.getSolution().row_dual)[: problem.A.shape[0]]


def project(problem, group: np.ndarray, prices: np.ndarray):
    """The relaxation on ``group``'s columns (a boolean mask): each row that meets them with the other columns' range
    moved into its bounds, the costs plus ``prices`` (per row, >= 0) times the rows' coefficients. Returns the part
    and, per row of ``problem``, its row in the part (-1 where dropped). The part keeps the whole relaxation's stages and
    column maps (it is only solved, never made a schedule)."""
    A = problem.A.tocsc()
    mine, other = A[:, group], A[:, ~group]
    upper_other = problem.upper[~group]
    low = other.minimum(0) @ upper_other
    high = other.maximum(0) @ upper_other
    keep = np.flatnonzero(mine.getnnz(axis=1) > 0)
    index = np.full(A.shape[0], -1)
    index[keep] = np.arange(keep.size)
    cost = problem.cost + sp.csr_matrix(prices[None, :]) @ problem.A
    part = replace(
        problem, cost=np.asarray(cost).ravel()[group], upper=problem.upper[group], A=mine.tocsr()[keep],
        row_lower=problem.row_lower[keep] - high[keep], row_upper=problem.row_upper[keep] - low[keep],
        runtime=None if problem.runtime is None else problem.runtime[group], gaps=None, memory=None,
    )
    return part, index


def buckets(coefficients: np.ndarray, room: float) -> list[tuple[float, float]]:
    """Ranges of E = coefficients . x (x binary) that together hold every value E can take: [k s, (k+1) s - 1] with s
    the largest coefficient where all are integers (E is one then), else the closed [k s, (k+1) s], up to the least of
    their sum and ``room``."""
    s = float(coefficients.max())
    most = min(float(coefficients.sum()), room)
    integral = bool(np.all(coefficients == np.round(coefficients)))
    count = int(math.floor(most / s)) + 1
    return [(k * s, min(most, (k + 1) * s - 1.0) if integral else (k + 1) * s) for k in range(count)]


def with_rows(part, rows: tuple) -> object:
    """``part`` with bucket rows (a coefficient vector on its columns, lower, upper) appended."""
    if not rows:
        return part
    extra = sp.csr_matrix(np.vstack([vector for vector, _, _ in rows]))
    return replace(
        part, A=sp.vstack([part.A, extra]).tocsr(), row_lower=np.append(part.row_lower, [lo for _, lo, _ in rows]),
        row_upper=np.append(part.row_upper, [hi for _, _, hi in rows]),
    )


def bucket_bound(part, levels: list[tuple[np.ndarray, float]], target: float, deadline: float) -> tuple[float | None, int, bool]:
    """The least proven bound over the buckets of ``part`` by ``levels`` (per level, E's coefficients on the part's
    columns and its room). A bucket is done once its bound reaches the stop: ``target``, or the least value of a point
    of ``part`` found so far (any bucket's incumbent: A's optimum is at most that, so a bucket proven above it cannot
    lower the least bound by more than HiGHS's absolute gap). A bucket of an inner level is tried for ``TRY_S`` and
    split by the next level where the try falls short; the last level's take the time left (``LEAF_MIN_S`` kept for
    each bucket still waiting). A bucket's bound is the better of its own and its parent's (both bound its points); one
    that time cuts off counts with its parent's. The least, less ``SAFETY``, is the bound. Returns (the bound or None,
    the buckets solved, whether each reached the stop or its optimum)."""
    first, room = levels[0]
    pending = deque((((first, lo, hi),), 1, None) for lo, hi in buckets(first, room))
    proven: list[float] = []
    solved, reached, least = 0, True, math.inf
    while pending:
        rows, depth, inherited = pending.popleft()
        stop = min(target, least)
        left = deadline - time.perf_counter()
        if inherited is not None and (inherited >= stop or left <= 0.2):
            proven.append(inherited)
            reached = reached and inherited >= stop
            continue
        if left <= 0.2:
            return None, solved, False
        inner = depth < len(levels)
        limit = min(TRY_S, left) if inner else max(0.2, left - LEAF_MIN_S * len(pending))
        bucket = with_rows(part, rows)
        result = solve_highspy(bucket, True, limit, 1e-6, None, stop)
        solved += 1
        if result.status == 2:  # (no point in this bucket)
            continue
        if result.x is not None:
            least = min(least, float(bucket.cost @ result.x))
        own = result.mip_dual_bound
        value = own if inherited is None else inherited if own is None else max(own, inherited)
        done = result.status == 0 or (value is not None and value >= min(target, least))
        if inner and not done:
            vector, room = levels[depth]
            pending.extend((rows + ((vector, lo, hi),), depth + 1, value) for lo, hi in buckets(vector, room))
            continue
        if value is None:
            return None, solved, False
        proven.append(value)
        reached = reached and done
    return (min(proven) - SAFETY if proven else None), solved, reached


def split_bound(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float, target_j: float, max_columns: int | None = None, split: int | None = None,
) -> SplitBound:
    """The Lagrangian bound (J) of the interval relaxation with its idle-gap and kept-through rows, split at
    :func:`split_vertex` (the module's docstring: why it is valid, and the rules), within ``time_limit_s``; each bucket
    of part A stops once it reaches what ``target_j`` (the caller's certificate) leaves it after part B's bound. Nothing
    (``bound_j`` None) over ``max_columns`` columns, without a cut vertex, or where no memory row couples the parts.
    ``split``: another cut vertex than the rule's (the tests try each)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    nothing = SplitBound(None, None, 0, 0, False, 0.0)
    split = split_vertex(graph) if split is None else split
    problem = None if split is None else interval_problem(graph, costs, options)
    if problem is None or (max_columns is not None and problem.cost.size > max_columns):
        return replace(nothing, split=split, seconds=time.perf_counter() - started)
    group = column_tensors(graph, problem) <= split
    A = problem.A.tocsr()
    memory = np.array(problem.memory)
    meets_a = np.asarray(A[:, group].getnnz(axis=1) > 0)
    meets_b = np.asarray(A[:, ~group].getnnz(axis=1) > 0)
    coupled = memory[meets_a[memory] & meets_b[memory]]
    duals = None if coupled.size == 0 else lp_duals(problem, max(0.1, deadline - time.perf_counter()))
    if duals is None:
        return replace(nothing, split=split, seconds=time.perf_counter() - started)
    prices = np.zeros(A.shape[0])
    prices[coupled] = np.maximum(0.0, -duals[coupled])  # (a row m(x) <= room: HiGHS's dual is <= 0 at the minimum)
    constant = -float(prices[coupled] @ problem.row_upper[coupled])  # (- lambda . room)
    part_a, index_a = project(problem, group, prices)
    part_b, _ = project(problem, ~group, prices)
    b_limit = min(B_MAX_S, B_SHARE * time_limit_s, max(0.1, deadline - time.perf_counter()))
    solved_b = solve_highspy(part_b, True, b_limit, 1e-6, None, None)
    bound_b = 0.0 if solved_b.mip_dual_bound is None else max(0.0, solved_b.mip_dual_bound - SAFETY)  # (B's costs and prices are >= 0)
    target_a = target_j / costs.plain_step_energy_j - 1.0 - constant - bound_b
    rows = bucket_rows(memory, index_a, coupled, prices)
    levels = [(part_a.A[index_a[r]].toarray().ravel(), float(part_a.row_upper[index_a[r]])) for r in rows]
    bound_a, solved, reached = bucket_bound(part_a, levels, target_a, deadline)
    seconds = time.perf_counter() - started
    found = None if bound_a is None else costs.plain_step_energy_j * (1.0 + constant + bound_b + bound_a)
    log.info(
        "split bound (cut vertex %d, %d memory rows priced, %d buckets): %s (B %.6f, constant %.6f, A %s; %.1f s)", split, coupled.size, solved,
        "-" if found is None else f"{found / costs.plain_step_energy_j:.6f} x one plain step", bound_b, constant, "-" if bound_a is None else f"{bound_a:.6f}", seconds,
    )
    stages = tuple(problem.stages[int(np.flatnonzero(memory == r)[0])] for r in rows)
    return SplitBound(found, split, int(coupled.size), solved, reached, seconds, stages)


def bucket_rows(memory: np.ndarray, index: np.ndarray, coupled: np.ndarray, prices: np.ndarray) -> list[int]:
    """NOTE 30's bucket stages, as memory rows: the coupling row with the largest price, then the first row stage after
    the coupled ones whose memory row A's tensors enter (``index``: the row in A's part, -1 where A has none), if any."""
    rows = [int(coupled[np.argmax(prices[coupled])])]
    last = int(np.flatnonzero(np.isin(memory, coupled)).max())
    later = [int(r) for r in memory[last + 1 :] if index[r] >= 0]
    return rows + later[:1]

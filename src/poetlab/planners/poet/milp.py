"""POET's mixed-integer program, built once as sparse matrices.

Checkmate's frontier-advancing formulation extended with paging, as in the POET release (see
``../shared/reference/poet-cost-model.md``). Stage t must compute node t; in stage t a node may be
(re)computed (R), kept in RAM from the previous stage (S_RAM), kept on flash (S_SSD), paged in (M_IN) or
out (M_OUT); FREE marks the point after which an input is no longer held, and U the RAM in use after
each computation of a stage, bounded by the budget. The objective is energy. A compute off the
diagonal (R[t, i], i < t) is a rerun, priced at the cost model's rerun costs (the node's own costs in
the paper's flop model; apart on a profiled host, :class:`~poetlab.core.costs.CostModel`).

Only variables that can be non-zero are created (nothing is computed, kept or paged ahead of its stage),
and every constraint family is built from numpy index arrays, so building a 300-node graph takes a
fraction of a second. The solver backends (:mod:`poetlab.planners.poet.backends`) take the resulting
:class:`MilpModel` as plain arrays.

Faithful mode reproduces the release's formulation; the named options fix its quirks:

- ``count_paging_time``: paging time counts in the runtime budget (the release counts compute only);
- ``charge_pagein``: a tensor paged in during a stage holds RAM during that stage (the release does not
  charge it; with this option page-ins are prefetched at the start of the stage, overlapping compute);
- ``params_in_budget``: parameters and their gradients are charged to the budget (the release keeps them
  outside).

``compression`` adds a fourth choice per tensor beside keeping, recomputing and paging it: keeping it
compressed in RAM (BitTrain's bitmap format, :mod:`poetlab.techniques.compression`). Three more
families: S_CMP (a compressed copy held at the start of stage t, charged its compressed bytes), M_CMP
(compress in stage t, from a dense copy resident at the stage start, like a page-out; the copy is
charged from that stage on) and M_DCMP (decompress at the end of stage t, like a page-in: the dense
tensor is resident in stage t + 1; the compressed copy must be held in stage t + 1 too, so that the
moment of decompression never holds more than the next stage's start). Compress and decompress cost
energy in the objective and time in the runtime budget.

One deliberate difference from the release in every mode: the release's memory recurrence iterates over
its edge list with a duplicate (its first gradient node reads the loss twice), so it frees the loss's
bytes twice and can undercount RAM by that tensor's size; we free each tensor once. We also leave out
rows that cannot bind (U after the stage's own node, FREE where the consumer cannot run) and size each
big-M by the consumers that can run in the stage. Checked against the release's rows transcribed one by
one (``tests/release_milp.py``): the same certified optima at a gap of 1e-6. (An apparent 0.04% gap on
linear/m4 at 3,800 bytes was HiGHS's default absolute gap, 1e-6, against an objective of 4.6e-4 J: the
backends now see the objective in units of one plain step, :func:`poetlab.planners.poet.backends.run_milp`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CompressionCosts, CostModel
from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.rows import SparseRows


@dataclass(frozen=True)
class MilpOptions:
    """What the MILP may do and the budgets it must meet.

    ``ram_budget_bytes`` bounds RAM for activations (and, with ``params_in_budget``, parameters and
    gradients too); ``runtime_budget_factor`` bounds runtime as a multiple of one plain step.
    """

    ram_budget_bytes: float
    runtime_budget_factor: float | None = None
    paging: bool = True
    remat: bool = True
    count_paging_time: bool = False
    charge_pagein: bool = False
    params_in_budget: bool = False
    compression: bool = False

    @property
    def faithful(self) -> bool:
        return not (self.count_paging_time or self.charge_pagein or self.params_in_budget or self.compression)


@dataclass(frozen=True)
class MilpModel:
    """min c @ x  s.t.  row_lower <= A @ x <= row_upper,  col_lower <= x <= col_upper,  x[integer] integral.

    ``index`` maps each T x T variable family (R, S_RAM, S_SSD, M_IN, M_OUT, and with compression
    S_CMP, M_CMP, M_DCMP) to a T x T array of column indices, -1 where the variable does not exist (is
    fixed to zero).
    """

    c: np.ndarray
    A: sp.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray
    index: dict[str, np.ndarray] = field(repr=False)
    free_index: np.ndarray = field(repr=False)
    u_index: np.ndarray = field(repr=False)
    edges: np.ndarray = field(repr=False)
    node_bytes: np.ndarray = field(repr=False)
    charge_pagein: bool = False
    fixed_bytes: int = 0
    runtime_budget_s: float | None = None
    compressed_bytes: np.ndarray | None = field(default=None, repr=False)
    #: each node's workspace, counted in U[t, k] when R[t, k] (None: all zero, as on the paper's graphs); the
    #: lower figure where a forward node left alone picks it (TrainingGraph.workspace_left_alone)
    node_workspace: np.ndarray | None = field(default=None, repr=False)
    #: forward node -> its column of MANAGED (1 when the schedule recomputes, pages or compresses it or one of
    #: its views, poetlab.core.schedule.managed_nodes, or reruns a reader of its output), and the nodes whose
    #: operations set it
    managed_index: dict[int, int] = field(default_factory=dict, repr=False)
    managed_by: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    #: forward node -> the readers whose reruns set its MANAGED too (TrainingGraph.workspace_readers)
    managed_readers: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    #: backward node -> (its forward node, the workspace it adds where that node is managed)
    managed_workspace: dict[int, tuple[int, float]] = field(default_factory=dict, repr=False)
    #: forward node of TrainingGraph.early_release -> (its column of KEPT: 1 when the schedule keeps its output
    #: tensor to its free; the nodes whose reruns set it; the stages its output tensor's bytes leave U otherwise)
    kept_index: dict[int, int] = field(default_factory=dict, repr=False)
    kept_by: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    release_window: dict[int, tuple[int, int, float]] = field(default_factory=dict, repr=False)

    @property
    def n_cols(self) -> int:
        return int(self.c.shape[0])

    @property
    def n_rows(self) -> int:
        return int(self.A.shape[0])

    @property
    def energy_scale(self) -> float:
        """The energy of one plain step (every node computed once), or 1: the unit the backends see
        the objective in."""
        diagonal = np.diagonal(self.index["R"])
        energy = float(self.c[diagonal[diagonal >= 0]].sum())
        return energy if energy > 0 else 1.0

    def encode(self, matrices: dict[str, np.ndarray]) -> np.ndarray:
        """The solution vector of a schedule given as T x T matrices (R, S_RAM, S_SSD, M_IN, M_OUT),
        with FREE and U derived by the formulation's own rules: a MIP start for the solver."""
        x = np.zeros(self.n_cols)
        managed = self._managed(matrices)
        kept = self._kept(matrices)
        for name, idx in self.index.items():
            exists = idx >= 0
            x[idx[exists]] = np.asarray(matrices[name], dtype=float)[exists]
        R = np.asarray(matrices["R"], dtype=bool)
        S_RAM = np.asarray(matrices["S_RAM"], dtype=bool)
        T = R.shape[0]
        src, dst = self.edges[:, 0], self.edges[:, 1]
        b = self.node_bytes
        for t in range(T):
            keep_next = S_RAM[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
            computed = np.flatnonzero(R[t])
            # the last node of stage t that reads each tensor
            last_reader = np.full(T, -1)
            for k in computed:
                last_reader[src[dst == k]] = k
            free = R[t, dst] & ~keep_next[src] & (last_reader[src] == dst)
            cols = self.free_index[t]
            has = cols >= 0
            x[cols[has]] = free[has]
            memory = float(R[t, 0] * b[0] + S_RAM[t] @ b)
            if self.charge_pagein:
                memory += float(np.asarray(matrices["M_IN"], dtype=bool)[t] @ b)
            if self.compressed_bytes is not None:
                held = np.asarray(matrices["S_CMP"], dtype=float)[t] + np.asarray(matrices["M_CMP"], dtype=float)[t]
                memory += float(held @ self.compressed_bytes)
            # U[t, k+1] = U[t, k] + R[t, k+1] b[k+1] - (bytes freed after node k)
            freed_after = np.bincount(dst[free], weights=b[src[free]], minlength=T)
            steps = R[t, 1 : t + 1] * b[1 : t + 1] - freed_after[:t]
            u = memory + np.concatenate(([0.0], np.cumsum(steps)))
            if self.node_workspace is not None:
                u = u + R[t, : t + 1] * self.node_workspace[: t + 1]
            if t in self.managed_workspace:
                f, extra = self.managed_workspace[t]
                u[t] += extra * managed[f]
            for f, (first, last, released) in self.release_window.items():
                if first <= t <= last:
                    u = u - released * (1.0 - kept[f])
            x[self.u_index[t, : t + 1]] = u
        for f, col in self.managed_index.items():
            x[col] = managed[f]
        for f, col in self.kept_index.items():
            x[col] = kept[f]
        return x

    def _kept(self, matrices: dict[str, np.ndarray]) -> dict[int, float]:
        """KEPT of each early-release node, from a schedule's matrices (as the formulation's rows bound it: a
        rerun, page-out or compress of the node, or a rerun of one of its tensor readers)."""
        R = np.asarray(matrices["R"], dtype=bool)
        moves = [np.asarray(matrices[name], dtype=bool) for name in ("M_OUT", "M_CMP") if name in matrices]
        return {
            f: float(any(m[:, f].any() for m in moves) or any(R[s + 1 :, s].any() for s in sources))
            for f, sources in self.kept_by.items()
        }

    def _managed(self, matrices: dict[str, np.ndarray]) -> dict[int, float]:
        """MANAGED of each forward node with a column, from a schedule's matrices (as the formulation's rows
        bound it: a rerun, a page-out or a compress of the node or of one of its views)."""
        R = np.asarray(matrices["R"], dtype=bool)
        moves = [np.asarray(matrices[name], dtype=bool) for name in ("M_OUT", "M_CMP") if name in matrices]
        return {
            f: float(any(R[s + 1 :, s].any() or any(m[:, s].any() for m in moves) for s in sources) or any(R[r + 1 :, r].any() for r in self.managed_readers.get(f, ())))
            for f, sources in self.managed_by.items()
        }

    def decode(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The T x T boolean matrices of a solution vector (values rounded at 0.5)."""
        out = {}
        for name, idx in self.index.items():
            matrix = np.zeros(idx.shape, dtype=bool)
            exists = idx >= 0
            matrix[exists] = np.asarray(x)[idx[exists]] > 0.5
            out[name] = matrix
        return out


class _Columns:
    def __init__(self) -> None:
        self.n = 0
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.integer: list[np.ndarray] = []
        self.cost: list[np.ndarray] = []

    def add(self, mask: np.ndarray, lower: float | np.ndarray, upper: float | np.ndarray, integer: bool, cost: np.ndarray | float = 0.0) -> np.ndarray:
        """Create one column per True of ``mask``; return an array of ``mask``'s shape with the column
        indices and -1 elsewhere. ``cost`` broadcasts against ``mask``."""
        index = np.full(mask.shape, -1, dtype=np.int64)
        count = int(mask.sum())
        index[mask] = np.arange(self.n, self.n + count)
        self.n += count
        self.lower.append(np.broadcast_to(np.asarray(lower, dtype=float), mask.shape)[mask])
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=float), mask.shape)[mask])
        self.integer.append(np.full(count, integer))
        self.cost.append(np.broadcast_to(np.asarray(cost, dtype=float), mask.shape)[mask])
        return index


def _at_least_each(cols: _Columns, rows: SparseRows, T: int, moves_of: dict[int, np.ndarray]) -> dict[int, int]:
    """One continuous column in [0, 1] per node of ``moves_of`` (in node order), at least each of the move
    columns given for it (-1: a move fixed to zero, left out): 1 wherever the schedule makes one of them. The
    MILP's KEPT_f (rows 6r) and MANAGED_f (rows 6w), which only add memory where they are 1. Returns node ->
    column."""
    if not moves_of:
        return {}
    mask = np.zeros(T, dtype=bool)
    mask[list(moves_of)] = True
    column = cols.add(mask, 0.0, 1.0, False)
    index = {f: int(column[f]) for f in moves_of}
    for f, moves in moves_of.items():
        moves = moves[moves >= 0]
        ids = rows.new(moves.size, 0.0, np.inf)  # column - move >= 0
        rows.terms(ids, np.full(moves.size, index[f]), 1.0)
        rows.terms(ids, moves, -1.0)
    return index


@dataclass(frozen=True)
class _Variables:
    """The MILP's T x T variable families as arrays of column indices (-1 where the variable is fixed to zero),
    with the sizes and masks they were made from: what every row family reads, so that each family is built
    by a function of a few arguments."""

    T: int
    b: np.ndarray  # each node's output bytes
    compressed: np.ndarray  # each node's compressed bytes (zero without compression)
    edges: np.ndarray  # distinct (producer, consumer), E x 2
    src: np.ndarray  # edges[:, 0]
    dst: np.ndarray  # edges[:, 1]
    lower_incl: np.ndarray  # (t, i) with i <= t
    strict: np.ndarray  # (t, i) with i < t
    compressible: np.ndarray  # (t, i) where S_CMP and M_CMP exist
    free_mask: np.ndarray  # (t, e) where FREE exists
    R: np.ndarray
    S_RAM: np.ndarray
    S_SSD: np.ndarray
    M_IN: np.ndarray
    M_OUT: np.ndarray
    U: np.ndarray
    S_CMP: np.ndarray
    M_CMP: np.ndarray
    M_DCMP: np.ndarray
    FREE: np.ndarray  # T x E


def _add_columns(graph: TrainingGraph, costs: CostModel, options: MilpOptions, compression: CompressionCosts | None, budget: float, cols: _Columns) -> _Variables:
    """The columns of the T x T families, only where a variable can be non-zero: nothing is computed, kept or
    paged ahead of its stage, a pinned node is neither recomputed nor paged, FREE exists only where its consumer
    can run; each with its bounds and its energy in the objective. (KEPT and MANAGED come with their rows, 6r
    and 6w.)"""
    T = graph.n_nodes
    stage = np.arange(T)[:, None]
    node = np.arange(T)[None, :]
    lower_incl = node <= stage  # (t, i) with i <= t
    strict = node < stage  # (t, i) with i < t
    diagonal = node == stage

    movable = ~graph.pinned[None, :]  # pinned nodes (a traced graph's gradients) are neither recomputed nor paged
    compute_energy = np.where(diagonal, costs.compute_energy_j[None, :], costs.recompute_energy_j[None, :])  # (off the diagonal: reruns)
    R = cols.add((lower_incl & movable) | diagonal if options.remat else diagonal, np.where(diagonal, 1.0, 0.0), 1.0, True, compute_energy)
    S_RAM = cols.add(strict, 0.0, 1.0, True)
    none = np.zeros((T, T), dtype=bool)
    paging = strict & movable if options.paging else none
    S_SSD = cols.add(paging, 0.0, 1.0, True)
    M_IN = cols.add(paging, 0.0, 1.0, True, costs.pagein_energy_j[None, :])
    M_OUT = cols.add(paging, 0.0, 1.0, True, costs.pageout_energy_j[None, :])
    U = cols.add(lower_incl, 0.0, max(budget, 0.0), False)
    compressible = strict & compression.allowed[None, :] if compression is not None else none
    S_CMP = cols.add(compressible, 0.0, 1.0, True)
    M_CMP = cols.add(compressible, 0.0, 1.0, True, compression.compress_energy_j[None, :] if compression is not None else 0.0)
    M_DCMP = cols.add(compressible & (stage < T - 1), 0.0, 1.0, True, compression.decompress_energy_j[None, :] if compression is not None else 0.0)

    edges = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)  # distinct (producer, consumer)
    dst = edges[:, 1]
    # FREE[t, e] for edges e = (i, k) with k <= t, only where R[t, k] can be 1
    free_mask = (dst[None, :] <= stage) & (R[:, dst] >= 0)
    FREE = cols.add(free_mask, 0.0, 1.0, True)
    compressed = compression.compressed_bytes.astype(float) if compression is not None else np.zeros(T)
    return _Variables(
        T=T, b=graph.output_bytes.astype(float), compressed=compressed, edges=edges, src=edges[:, 0], dst=dst,
        lower_incl=lower_incl, strict=strict, compressible=compressible, free_mask=free_mask,
        R=R, S_RAM=S_RAM, S_SSD=S_SSD, M_IN=M_IN, M_OUT=M_OUT, U=U, S_CMP=S_CMP, M_CMP=M_CMP, M_DCMP=M_DCMP, FREE=FREE,
    )


def _input_rows(v: _Variables, rows: SparseRows) -> None:
    """(1) A node computed in stage t has its inputs in RAM: R[t, k] <= R[t, i] + S_RAM[t, i] for each edge
    (i, k) with k <= t (an input is computed earlier in the stage or held from the stage before)."""
    t_idx, e_idx = np.nonzero(v.dst[None, :] <= np.arange(v.T)[:, None])
    i_of, k_of = v.src[e_idx], v.dst[e_idx]
    ids = rows.new(t_idx.size, -np.inf, 0.0)
    rows.terms(ids, v.R[t_idx, k_of], 1.0)
    rows.terms(ids, v.R[t_idx, i_of], -1.0)
    rows.terms(ids, v.S_RAM[t_idx, i_of], -1.0)


def _carry_rows(v: _Variables, rows: SparseRows, compression: bool, paging: bool) -> None:
    """What a stage starts with, the stage before held or made: (2) in RAM,
    S_RAM[t+1, i] <= S_RAM[t, i] + R[t, i] + M_IN[t, i] + M_DCMP[t, i]; with compression (3c) compressed,
    S_CMP[t+1, i] <= S_CMP[t, i] + M_CMP[t, i], and (4c) compress only what is in RAM at the stage start,
    decompress only what is compressed, keeping the compressed copy into the next stage; with paging (3) on
    flash, S_SSD[t+1, i] <= S_SSD[t, i] + M_OUT[t, i]."""
    INF = np.inf
    t_idx, i_idx = np.nonzero(v.lower_incl[:-1])
    ids = rows.new(t_idx.size, -INF, 0.0)
    rows.terms(ids, v.S_RAM[t_idx + 1, i_idx], 1.0)
    rows.terms(ids, v.S_RAM[t_idx, i_idx], -1.0)
    rows.terms(ids, v.R[t_idx, i_idx], -1.0)
    rows.terms(ids, v.M_IN[t_idx, i_idx], -1.0)
    rows.terms(ids, v.M_DCMP[t_idx, i_idx], -1.0)
    if compression:
        # (3c) S_CMP[t+1, i] <= S_CMP[t, i] + M_CMP[t, i]
        ids = rows.new(t_idx.size, -INF, 0.0)
        rows.terms(ids, v.S_CMP[t_idx + 1, i_idx], 1.0)
        rows.terms(ids, v.S_CMP[t_idx, i_idx], -1.0)
        rows.terms(ids, v.M_CMP[t_idx, i_idx], -1.0)
        # (4c) M_CMP[t, i] <= S_RAM[t, i], M_DCMP[t, i] <= S_CMP[t, i] and M_DCMP[t, i] <= S_CMP[t+1, i]
        ct, ci = np.nonzero(v.compressible)
        T = v.T
        for lhs, rhs in ((v.M_CMP[ct, ci], v.S_RAM[ct, ci]), (v.M_DCMP[ct, ci], v.S_CMP[ct, ci]), (v.M_DCMP[ct, ci], v.S_CMP[np.minimum(ct + 1, T - 1), ci])):
            ids = rows.new(ct.size, -INF, 0.0)
            rows.terms(ids, lhs, 1.0)
            rows.terms(ids, rhs, -1.0)
    if paging:
        ids = rows.new(t_idx.size, -INF, 0.0)
        rows.terms(ids, v.S_SSD[t_idx + 1, i_idx], 1.0)
        rows.terms(ids, v.S_SSD[t_idx, i_idx], -1.0)
        rows.terms(ids, v.M_OUT[t_idx, i_idx], -1.0)


def _paging_rows(v: _Variables, rows: SparseRows) -> None:
    """(4) Page in only what is on flash, page out only what is in RAM: M_IN[t, i] <= S_SSD[t, i] and
    M_OUT[t, i] <= S_RAM[t, i] (a tensor is paged from where it is at the stage start)."""
    t_idx, i_idx = np.nonzero(v.strict)
    ids = rows.new(t_idx.size, -np.inf, 0.0)
    rows.terms(ids, v.M_IN[t_idx, i_idx], 1.0)
    rows.terms(ids, v.S_SSD[t_idx, i_idx], -1.0)
    ids = rows.new(t_idx.size, -np.inf, 0.0)
    rows.terms(ids, v.M_OUT[t_idx, i_idx], 1.0)
    rows.terms(ids, v.S_RAM[t_idx, i_idx], -1.0)


def _free_rows(graph: TrainingGraph, v: _Variables, rows: SparseRows) -> None:
    """(5) FREE[t, (i, k)] = 1 exactly when k runs in stage t, i is not kept for stage t+1, and no later
    consumer j > k of i runs in stage t: with hazards h = 1 - R[t,k] + S_RAM[t+1,i] + sum_j R[t,j],
    1 - FREE <= h and M (1 - FREE) >= h, M the largest value h can take (sized by the consumers that can run
    in the stage, a tighter LP than one M for all)."""
    INF = np.inf
    T, R, edges = v.T, v.R, v.edges
    t_idx, e_idx = np.nonzero(v.free_mask)
    i_of, k_of = v.src[e_idx], v.dst[e_idx]
    free_col = v.FREE[t_idx, e_idx]
    keep_col = np.where(t_idx + 1 < T, v.S_RAM[np.minimum(t_idx + 1, T - 1), i_of], -1)
    # later consumers of i (j > k) per edge, as (edge, j) pairs, then joined with the stages
    consumers = graph.consumers
    pair_edge = np.concatenate([np.full(sum(1 for j in consumers[i] if j > k), e) for e, (i, k) in enumerate(edges)] or [np.zeros(0, np.int64)]).astype(np.int64)
    pair_j = np.concatenate([np.array([j for j in consumers[i] if j > k], dtype=np.int64) for i, k in edges] or [np.zeros(0, np.int64)])
    # for each FREE row (t, e), the R[t, j] columns of its later consumers
    order = np.argsort(pair_edge, kind="stable")
    pair_edge, pair_j = pair_edge[order], pair_j[order]
    start = np.searchsorted(pair_edge, np.arange(len(edges)))
    count = np.searchsorted(pair_edge, np.arange(len(edges)), side="right") - start
    row_rep = np.repeat(np.arange(t_idx.size), count[e_idx])
    offsets = np.arange(row_rep.size) - np.repeat(np.cumsum(count[e_idx]) - count[e_idx], count[e_idx])
    j_rep = pair_j[start[e_idx][row_rep] + offsets]
    later_cols = R[t_idx[row_rep], j_rep]
    n_later = np.bincount(row_rep[later_cols >= 0], minlength=t_idx.size)
    big_m = 1.0 + (keep_col >= 0) + n_later
    for lower, upper, free_coef in ((-INF, 0.0, -1.0), (1.0 - big_m, INF, -big_m)):
        ids = rows.new(t_idx.size, lower, upper)
        rows.terms(ids, free_col, free_coef)
        rows.terms(ids, R[t_idx, k_of], 1.0)
        rows.terms(ids, keep_col, -1.0)
        rows.terms(ids[row_rep], later_cols, -1.0)


def _memory_rows(graph: TrainingGraph, v: _Variables, cols: _Columns, rows: SparseRows, charge_pagein: bool) -> dict[str, Any]:
    """(6) memory: U[t, k] is the RAM in use after node k runs in stage t, and its upper bound is the budget.
        U[t, 0] = R[t, 0] b0 + sum_i S_RAM[t, i] b_i (+ M_IN[t, i] b_i when charged, + compressed copies)
        U[t, k+1] = U[t, k] + R[t, k+1] b_{k+1} - sum_{(i, k)} FREE[t, (i, k)] b_i
    with early releases (6r) and workspaces (6w) on top. Returns the MilpModel fields those two define."""
    start, release = _stage_start_rows(graph, v, cols, rows, charge_pagein)
    row_of = _step_rows(v, rows)
    workspace = _workspace_rows(graph, v, cols, rows, start, row_of)
    ft, fe = np.nonzero(v.free_mask)
    fk = v.dst[fe]
    has_row = fk < ft  # frees after node k feed the step to k + 1, which exists when k < t
    rows.terms(row_of[ft[has_row], fk[has_row]], v.FREE[ft[has_row], fe[has_row]], v.b[v.src[fe[has_row]]])
    return release | workspace


def _stage_start_rows(graph: TrainingGraph, v: _Variables, cols: _Columns, rows: SparseRows, charge_pagein: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """(6)'s U[t, 0], one row per stage, with (6r): a node f of TrainingGraph.early_release left alone holds only
    its saved tensors from the stage after its last tensor reader's to its last reader's (held there: computed
    once, never paged, R[t, t] = 1): U[t, 0] -= r_f (1 - KEPT_f) there, KEPT_f >= each rerun, page-out and
    compress of f and each rerun of a tensor reader of f (poetlab.core.schedule.released_nodes). Returns the
    rows' ids and the MilpModel fields of 6r."""
    T, R = v.T, v.R
    release = graph.early_release
    consumers = graph.consumers
    release_window = {f: (first, max(consumers[f]), float(r)) for f, (first, r, _) in release.items()}
    constant = np.zeros(T)
    for first, last, r in release_window.values():
        constant[first : last + 1] -= r
    ids = rows.new(T, constant, constant)
    kept_by = {f: (f, *(j for j in readers if not graph.nodes[j].is_backward)) for f, (_, _, readers) in release.items()}
    kept_index = _at_least_each(cols, rows, T, {f: np.concatenate([R[s_ + 1 :, s_] for s_ in sources] + [v.M_OUT[:, f], v.M_CMP[:, f]]) for f, sources in kept_by.items()})
    for f, col in kept_index.items():
        first, last, r = release_window[f]
        rows.terms(ids[first : last + 1], np.full(last + 1 - first, col), -r)
    rows.terms(ids, v.U[:, 0], 1.0)
    rows.terms(ids, R[:, 0], -v.b[0])
    t_idx, i_idx = np.nonzero(v.strict)
    rows.terms(ids[t_idx], v.S_RAM[t_idx, i_idx], -v.b[i_idx])
    if charge_pagein:
        rows.terms(ids[t_idx], v.M_IN[t_idx, i_idx], -v.b[i_idx])
    rows.terms(ids[t_idx], v.S_CMP[t_idx, i_idx], -v.compressed[i_idx])
    rows.terms(ids[t_idx], v.M_CMP[t_idx, i_idx], -v.compressed[i_idx])
    return ids, {"kept_index": kept_index, "kept_by": kept_by, "release_window": release_window}


def _step_rows(v: _Variables, rows: SparseRows) -> np.ndarray:
    """(6)'s U[t, k+1] = U[t, k] + R[t, k+1] b_{k+1}, one row per k + 1 <= t (U after the stage's own node is
    left out: it cannot bind), the frees to come (_memory_rows). Returns the T x T row ids, -1 where none."""
    T = v.T
    t_idx, k_idx = np.nonzero(v.strict[:, :-1])  # k + 1 <= t
    row_of = np.full((T, T), -1, dtype=np.int64)
    row_of[t_idx, k_idx] = ids_step = rows.new(t_idx.size, 0.0, 0.0)
    rows.terms(ids_step, v.U[t_idx, k_idx + 1], 1.0)
    rows.terms(ids_step, v.U[t_idx, k_idx], -1.0)
    rows.terms(ids_step, v.R[t_idx, k_idx + 1], -v.b[k_idx + 1])
    return row_of


def _workspace_rows(graph: TrainingGraph, v: _Variables, cols: _Columns, rows: SparseRows, start: np.ndarray, row_of: np.ndarray) -> dict[str, Any]:
    """(6w) a node's workspace (TrainingGraph.workspace, as the simulator counts it) is in U[t, k] while node k
    runs in stage t and gone from the next step: U[t, k] also holds R[t, k] w_k; a backward node b whose
    workspace is lower where the schedule leaves its forward node f alone (TrainingGraph.workspace_left_alone)
    holds the lower w_b and the difference d_b times MANAGED_f, which is at least each rerun, page-out and
    compress of f and of its views (poetlab.core.schedule.managed_nodes) and each rerun of a reader of its
    output, which an executor keeps to f's free (poetlab.core.schedule.left_alone_owners,
    TrainingGraph.workspace_readers): U[b, b] += d_b MANAGED_f. ``start`` and ``row_of`` are (6)'s rows
    (_stage_start_rows, _step_rows). Returns the MilpModel fields of 6w."""
    R, T = v.R, v.T
    w = graph.workspace_left_alone.astype(float)
    if w.any():
        t_idx, k_idx = np.nonzero(row_of >= 0)
        ids_step = row_of[t_idx, k_idx]
        rows.terms(start, R[:, 0], -w[0])
        rows.terms(ids_step, R[t_idx, k_idx + 1], -w[k_idx + 1])
        rows.terms(ids_step, R[t_idx, k_idx], w[k_idx])
    owner = graph.workspace_owner
    extra = graph.workspace.astype(float) - w
    views = sorted(graph.view_bases.items())
    managed_by = {
        int(f): (int(f), *(s for s, bases in views if not graph.nodes[s].is_backward and f in bases))
        for f in sorted(set(owner[owner >= 0].tolist()))
    }
    readers = graph.workspace_readers
    managed_index = _at_least_each(cols, rows, T, {
        f: np.concatenate([m for s_ in sources for m in (R[s_ + 1 :, s_], v.M_OUT[:, s_], v.M_CMP[:, s_])] + [R[r + 1 :, r] for r in readers.get(f, ())])
        for f, sources in managed_by.items()
    })
    if managed_index:
        for bwd in np.flatnonzero(owner >= 0):
            rows.terms(row_of[bwd, bwd - 1 : bwd], np.array([managed_index[int(owner[bwd])]]), -extra[bwd])
    return {
        "node_workspace": w if w.any() else None,
        "managed_index": managed_index,
        "managed_by": managed_by,
        "managed_readers": {f: readers.get(f, ()) for f in managed_by},
        "managed_workspace": {int(b): (int(owner[b]), float(extra[b])) for b in np.flatnonzero(owner >= 0)},
    }


def _runtime_row(v: _Variables, costs: CostModel, options: MilpOptions, compression: CompressionCosts | None, rows: SparseRows) -> float | None:
    """(7) runtime: sum R runtime (reruns at their rerun time; + paging time with count_paging_time; + compress
    and decompress time) <= factor * plain-step runtime. The budget in seconds; None, and no row, without a
    factor."""
    if options.runtime_budget_factor is None:
        return None
    runtime_budget_s = options.runtime_budget_factor * costs.plain_step_runtime_s
    ids = rows.new(1, -np.inf, runtime_budget_s)
    t_idx, i_idx = np.nonzero(v.R >= 0)
    rows.terms(np.zeros_like(t_idx) + ids[0], v.R[t_idx, i_idx], np.where(t_idx == i_idx, costs.runtime_s[i_idx], costs.recompute_runtime_s[i_idx]))
    if options.count_paging_time and options.paging:
        t_idx, i_idx = np.nonzero(v.M_IN >= 0)
        rows.terms(np.zeros_like(t_idx) + ids[0], v.M_IN[t_idx, i_idx], costs.pagein_time_s[i_idx])
        rows.terms(np.zeros_like(t_idx) + ids[0], v.M_OUT[t_idx, i_idx], costs.pageout_time_s[i_idx])
    if compression is not None:
        t_idx, i_idx = np.nonzero(v.compressible)
        rows.terms(np.zeros_like(t_idx) + ids[0], v.M_CMP[t_idx, i_idx], compression.compress_time_s[i_idx])
        rows.terms(np.zeros_like(t_idx) + ids[0], v.M_DCMP[t_idx, i_idx], compression.decompress_time_s[i_idx])
    return runtime_budget_s


def build_milp(graph: TrainingGraph, costs: CostModel, options: MilpOptions) -> MilpModel:
    """The POET MILP of ``graph`` with ``costs`` under ``options``: minimize the step's energy (computes, reruns,
    page-ins and page-outs, compresses and decompresses) over the schedules of POET's release's formulation,
    the module docstring's variables. The rows come from the release (``tests/release_milp.py`` transcribes
    them), numbered as there: (1) inputs in RAM, (2)/(3) what is held in RAM and on flash carries from stage
    to stage, (4) paging from where the tensor is, (5) FREE, (6) the memory recurrence bounded by the budget
    and (7) the runtime budget; (3c)/(4c) add compression, (6r) early releases and (6w) workspaces, the
    traced graphs' memory. Each family has its function below, called in this order, which fixes the
    columns' and rows' order."""
    compression = costs.compression if options.compression else None
    if options.compression and compression is None:
        raise InvalidArgumentError("compression needs compression costs: build them with poetlab.techniques.compression.compression_costs")
    fixed = (2 * graph.param_bytes if options.params_in_budget else 0) + graph.reserved_bytes  # (as poetlab.solve's)
    budget = float(options.ram_budget_bytes) - fixed
    cols = _Columns()
    v = _add_columns(graph, costs, options, compression, budget, cols)
    rows = SparseRows()
    _input_rows(v, rows)
    _carry_rows(v, rows, compression is not None, options.paging)
    if options.paging:
        _paging_rows(v, rows)
    _free_rows(graph, v, rows)
    memory = _memory_rows(graph, v, cols, rows, options.charge_pagein)
    runtime_budget_s = _runtime_row(v, costs, options, compression, rows)

    A = rows.matrix(cols.n)
    A.eliminate_zeros()  # (a node of zero flop has a zero runtime coefficient)
    return MilpModel(
        c=np.concatenate(cols.cost),
        A=A,
        row_lower=rows.lower,
        row_upper=rows.upper,
        col_lower=np.concatenate(cols.lower),
        col_upper=np.concatenate(cols.upper),
        integer=np.concatenate(cols.integer),
        index={"R": v.R, "S_RAM": v.S_RAM, "S_SSD": v.S_SSD, "M_IN": v.M_IN, "M_OUT": v.M_OUT}
        | ({"S_CMP": v.S_CMP, "M_CMP": v.M_CMP, "M_DCMP": v.M_DCMP} if compression is not None else {}),
        free_index=v.FREE,
        u_index=v.U,
        edges=v.edges,
        node_bytes=v.b,
        charge_pagein=options.charge_pagein,
        fixed_bytes=fixed,
        runtime_budget_s=runtime_budget_s,
        compressed_bytes=v.compressed if compression is not None else None,
        **memory,
    )

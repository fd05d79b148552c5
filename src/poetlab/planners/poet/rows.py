"""The rows of a sparse linear model, built in pieces: one way for every model of this package.

POET's MILP (:mod:`poetlab.planners.poet.milp`), the stage relaxation (:mod:`~poetlab.planners.poet.relaxation`),
the interval relaxation (:mod:`~poetlab.planners.poet.intervals`) and its idle-gap rows
(:mod:`~poetlab.planners.poet.idle_gaps`) all index their variables through arrays where a variable fixed to
zero (a choice a lever or the graph rules out) has no column and is given as -1. A term on such a column is a
term on zero, so it vanishes: :class:`SparseRows` drops it, and the builders never mask by hand.

Two forms, the same matrix: :meth:`SparseRows.new` + :meth:`SparseRows.terms`, vectorized (a block of rows,
then a coefficient for each, one array of columns at a time) for models laid out as T x T grids, and
:meth:`SparseRows.row`, one row with its columns, for models built by walking the graph.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class SparseRows:
    """Rows lower <= A x <= upper, their bounds and their nonzeros, in the order they were added."""

    def __init__(self) -> None:
        self.n = 0
        self._lower: list[np.ndarray] = []
        self._upper: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._single: list[tuple[float, float]] = []  # bounds of the latest rows from row(), not yet in _lower/_upper

    def new(self, count: int, lower: float | np.ndarray, upper: float | np.ndarray) -> np.ndarray:
        """``count`` new rows with bounds ``lower``, ``upper`` (scalars or one per row); their ids."""
        self._gather()
        ids = np.arange(self.n, self.n + count)
        self.n += count
        self._lower.append(np.broadcast_to(np.asarray(lower, dtype=float), (count,)).copy())
        self._upper.append(np.broadcast_to(np.asarray(upper, dtype=float), (count,)).copy())
        return ids

    def terms(self, rows: np.ndarray | int, cols: np.ndarray, vals: float | np.ndarray) -> None:
        """Add ``vals`` at (``rows``, ``cols``), the three broadcast together; entries whose column is -1 vanish."""
        rows, cols = np.broadcast_arrays(np.asarray(rows), np.asarray(cols, dtype=np.int64))
        vals = np.broadcast_to(np.asarray(vals, dtype=float), rows.shape)
        keep = cols >= 0
        self._rows.append(rows[keep].ravel())
        self._cols.append(cols[keep].ravel())
        self._vals.append(vals[keep].ravel())

    def row(self, cols, vals: float | np.ndarray, lower: float, upper: float) -> int:
        """One new row, lower <= sum vals * x[cols] <= upper (columns -1 vanish); its id. (The same as
        ``new(1, lower, upper)`` and ``terms``, whose array work per call made the interval relaxation's
        build 2.5x slower.)"""
        cols = np.asarray(cols, dtype=np.int64)
        keep = cols >= 0
        row = self.n
        self.n += 1
        self._single.append((lower, upper))
        self._rows.append(np.full(int(keep.sum()), row))
        self._cols.append(cols[keep])
        self._vals.append(np.broadcast_to(np.asarray(vals, dtype=float), cols.shape)[keep])
        return row

    def _gather(self) -> None:
        if self._single:
            bounds = np.array(self._single, dtype=float).reshape(-1, 2)
            self._lower.append(bounds[:, 0].copy())
            self._upper.append(bounds[:, 1].copy())
            self._single = []

    @property
    def lower(self) -> np.ndarray:
        self._gather()
        return np.concatenate([np.zeros(0), *self._lower])

    @property
    def upper(self) -> np.ndarray:
        self._gather()
        return np.concatenate([np.zeros(0), *self._upper])

    def matrix(self, n_cols: int) -> sp.csr_matrix:
        """A (rows x ``n_cols``), terms at the same place summed; explicit zeros are kept (a caller that wants
        them gone calls ``eliminate_zeros``)."""
        empty = np.zeros(0, dtype=np.int64)
        rows, cols = np.concatenate([empty, *self._rows]), np.concatenate([empty, *self._cols])
        A = sp.csr_matrix((np.concatenate([np.zeros(0), *self._vals]), (rows, cols)), shape=(self.n, n_cols))
        A.sum_duplicates()
        return A

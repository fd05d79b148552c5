"""The sparse-row builder every model of the poet package uses: columns -1 vanish, terms at one place add up,
row bounds stay with their rows, and the vectorized and one-row forms build the same matrix."""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from poetlab.planners.poet.rows import SparseRows


def test_terms_on_column_minus_one_vanish():
    rows = SparseRows()
    ids = rows.new(3, -np.inf, 0.0)
    rows.terms(ids, np.array([0, -1, 2]), np.array([1.0, 5.0, -2.0]))
    rows.terms(ids[1], np.array([-1, 1]), 3.0)  # one row, a column array, a scalar value
    A = rows.matrix(3)
    assert A.shape == (3, 3)
    assert A.nnz == 3
    np.testing.assert_array_equal(A.toarray(), [[1.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, -2.0]])


def test_terms_at_one_place_are_summed_and_a_zero_sum_stays_explicit():
    rows = SparseRows()
    (row,) = rows.new(1, 0.0, 0.0)
    rows.terms(row, np.array([1, 1, 0]), np.array([2.0, 0.5, 1.0]))
    rows.terms(row, np.array([0]), -1.0)
    A = rows.matrix(2)
    assert A.has_canonical_format
    np.testing.assert_array_equal(A.indices, [0, 1])
    np.testing.assert_array_equal(A.data, [0.0, 2.5])  # (build_milp drops such zeros itself)


def test_row_bounds_stay_with_their_rows_in_order():
    rows = SparseRows()
    first = rows.new(2, np.array([1.0, 2.0]), np.inf)
    single = rows.row([0], 1.0, -np.inf, 4.0)
    last = rows.new(1, 0.0, 0.0)
    tail = rows.row([1], 1.0, 3.0, 5.0)
    np.testing.assert_array_equal(first, [0, 1])
    assert single == 2 and last.tolist() == [3] and tail == 4 and rows.n == 5
    np.testing.assert_array_equal(rows.lower, [1.0, 2.0, -np.inf, 0.0, 3.0])
    np.testing.assert_array_equal(rows.upper, [np.inf, np.inf, 4.0, 0.0, 5.0])
    assert rows.matrix(2).shape == (5, 2)
    assert rows.lower.dtype == rows.upper.dtype == np.float64


def test_the_vectorized_and_one_row_forms_build_the_same_matrix():
    rng = np.random.default_rng(7)
    n_rows, n_cols, width = 40, 25, 6
    cols = rng.integers(-1, n_cols, size=(n_rows, width))  # some -1, some repeated within a row
    vals = rng.normal(size=(n_rows, width))
    lower, upper = -rng.random(n_rows), rng.random(n_rows)

    vectorized = SparseRows()
    ids = vectorized.new(n_rows, lower, upper)
    for k in range(width):
        vectorized.terms(ids, cols[:, k], vals[:, k])
    one_row = SparseRows()
    for r in range(n_rows):
        one_row.row(cols[r].tolist(), vals[r], lower[r], upper[r])

    A, B = vectorized.matrix(n_cols), one_row.matrix(n_cols)
    B.sort_indices()
    A.sort_indices()
    np.testing.assert_array_equal(A.indptr, B.indptr)
    np.testing.assert_array_equal(A.indices, B.indices)
    np.testing.assert_allclose(A.data, B.data, rtol=1e-15, atol=1e-15)  # summation order may differ
    np.testing.assert_array_equal(vectorized.lower, one_row.lower)
    np.testing.assert_array_equal(vectorized.upper, one_row.upper)
    dense = np.zeros((n_rows, n_cols))
    for r in range(n_rows):
        for c, v in zip(cols[r], vals[r]):
            if c >= 0:
                dense[r, c] += v
    np.testing.assert_allclose(A.toarray(), dense, rtol=1e-15, atol=1e-15)


def test_an_empty_builder_gives_an_empty_model():
    rows = SparseRows()
    A = rows.matrix(5)
    assert A.shape == (0, 5) and A.nnz == 0
    assert rows.lower.shape == rows.upper.shape == (0,)


def test_a_dropped_column_is_a_variable_fixed_to_zero_for_the_solver():
    """max x0 + x1 + x2 with x0 + x1 + x2 <= 2, x2 fixed to zero (column -1 in the rows, absent from the model)
    and x1 <= x0: HiGHS reaches 2 with x2 gone, as the full model does with x2's bounds at zero."""
    costs = -np.ones(3)
    full = np.array([[1.0, 1.0, 1.0], [-1.0, 1.0, 0.0]])
    fixed = milp(costs, constraints=[LinearConstraint(full, -np.inf, [2.0, 0.0])], integrality=np.ones(3), bounds=Bounds(0.0, [1.0, 1.0, 0.0]))
    index = np.array([0, 1, -1])  # x2 has no column
    rows = SparseRows()
    total = rows.row(index, 1.0, -np.inf, 2.0)
    order = rows.new(1, -np.inf, 0.0)
    rows.terms(order, index[[0, 1]], np.array([-1.0, 1.0]))
    built = milp(costs[:2], constraints=[LinearConstraint(rows.matrix(2), rows.lower, rows.upper)], integrality=np.ones(2), bounds=Bounds(0.0, 1.0))
    assert total == 0 and fixed.status == built.status == 0
    assert built.fun == fixed.fun == -2.0
    np.testing.assert_array_equal(built.x.round(), fixed.x[:2].round())

"""Checks of a point against a built MILP, shared by the MILP and compression tests."""

from __future__ import annotations

import numpy as np


def feasible(model, x, tol=1e-6):
    """Whether ``x`` satisfies every row and column bound of ``model`` (to a relative tolerance), and the
    rows it breaks."""
    activity = model.A @ x
    scale = 1 + np.abs(activity)
    rows_ok = (activity >= model.row_lower - tol * scale) & (activity <= model.row_upper + tol * scale)
    cols_ok = (x >= model.col_lower - tol) & (x <= model.col_upper + tol * (1 + np.abs(x)))
    return rows_ok.all() and cols_ok.all(), np.flatnonzero(~rows_ok)

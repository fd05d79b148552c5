"""OR-Tools CP-SAT on an integer program given as sparse rows, and on the interval relaxation (NOTE 14 in docs/solve.md:
measured; optional, not run by `solve`).

CP-SAT (the solver Moccasin, Bartan et al. 2023, used for rematerialization) takes integer coefficients
only. :func:`cp_model_of` turns ``min c @ x, row_lower <= A @ x <= row_upper, col_lower <= x <= col_upper``
into a CP-SAT model whose optimum, and whose proven bound, is never above the original's, so that a
bound read from it is a valid lower bound:

- a row whose coefficients are integers is kept as it is (its bounds rounded inwards: the activity of
  integers is an integer);
- any other row (POET's runtime row, in seconds) is scaled by a power of two and rounded so that it
  only loosens: ``floor(s a) @ x <= floor(s upper)`` and ``ceil(s a) @ x >= ceil(s lower)`` (x >= 0);
- the objective is scaled by a power of two and its costs rounded down, so the integer objective over
  the scale is at most ``c @ x`` at every x >= 0; the loss at a solution is at most its number of
  costly columns set, over the scale (reported as ``objective_loss``);
- every column must be integer (ValueError otherwise): the interval relaxation's are all binary. (POET's
  full MILP has continuous U columns, bytes pinned by equalities; it was not tried, NOTE 14.)

A solution is checked against the original rows by the caller (for POET: made into a schedule and
replayed by the simulator).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.errors import PoetlabError
from poetlab.planners.poet.intervals import IntervalBound, interval_problem, interval_schedule
from poetlab.planners.poet.milp import MilpOptions

log = logging.getLogger("poetlab.bounds")

_COEFF_BITS = 30  # a scaled row or objective's largest coefficient is below 2**_COEFF_BITS


class CpsatUnavailableError(PoetlabError):
    """OR-Tools is not installed, or cannot load beside highspy."""


def _cp_model():
    import importlib.util

    try:
        from ortools.sat.python import cp_model
    except ImportError as error:
        if importlib.util.find_spec("ortools") is None:
            raise CpsatUnavailableError(f"CP-SAT needs OR-Tools: pip install ortools ({error})") from None
        # (OR-Tools and highspy each bundle their own HiGHS library, and the second to load fails on its symbols)
        raise CpsatUnavailableError(f"OR-Tools is installed but did not load ({error}); it cannot share a process with highspy: run CP-SAT in a process that has not solved with HiGHS in-process") from None
    return cp_model


@dataclass(frozen=True)
class CpsatSolution:
    """CP-SAT's answer: ``status`` (optimal | feasible | infeasible | unknown), its best solution ``x``
    (None if none) and its objective ``c @ x`` in the caller's units, ``bound`` a proven lower bound on
    ``c @ x`` over the original rows (-inf where CP-SAT proved none), and the seconds its solve took."""

    status: str
    x: np.ndarray | None
    objective: float | None
    bound: float
    seconds: float
    objective_loss: float


def _scale(values: np.ndarray) -> float:
    biggest = float(np.abs(values).max()) if values.size else 0.0
    return 1.0 if biggest == 0 else 2.0 ** math.floor(_COEFF_BITS - math.log2(biggest))


def _integral(values: np.ndarray) -> np.ndarray:
    return np.abs(values - np.round(values)) <= 1e-9 * np.maximum(1.0, np.abs(values))


def cp_model_of(
    c: np.ndarray, A: sp.spmatrix, row_lower: np.ndarray, row_upper: np.ndarray, col_lower: np.ndarray,
    col_upper: np.ndarray, integer: np.ndarray | None = None, hint: np.ndarray | None = None,
):
    """The CP-SAT model (see the module's docstring) and the objective's scale (integer objective =
    ``floor(scale * c) @ x``)."""
    cp_model = _cp_model()
    A = sp.csr_matrix(A)
    n = A.shape[1]
    integer = np.ones(n, dtype=bool) if integer is None else np.asarray(integer, dtype=bool)
    if not (np.all(np.isfinite(col_lower)) and np.all(np.isfinite(col_upper))):
        raise ValueError("CP-SAT needs finite column bounds")
    if not np.all(integer):
        raise ValueError("CP-SAT holds integer columns only")
    whole = _integral(A.data)
    row_whole = np.ones(A.shape[0], dtype=bool)
    row_whole[np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))[~whole]] = False
    loose_cols = np.unique(A[~row_whole].indices)
    if np.any(np.asarray(col_lower)[loose_cols] < 0):
        raise ValueError("a row with fractional coefficients holds a column that may be negative")
    model = cp_model.CpModel()
    proto = model.proto
    lows = np.ceil(np.asarray(col_lower) - 1e-9).astype(np.int64).tolist()
    highs = np.floor(np.asarray(col_upper) + 1e-9).astype(np.int64).tolist()
    for lo, hi in zip(lows, highs):
        proto.variables.add().domain.extend([lo, hi])
    big = cp_model.INT_MAX // 4

    def add(cols, coeffs, lo, hi) -> None:
        ct = proto.constraints.add().linear
        ct.vars.extend(cols)
        ct.coeffs.extend(coeffs)
        ct.domain.extend([lo, hi])

    for r in range(A.shape[0]):
        cols = A.indices[A.indptr[r] : A.indptr[r + 1]]
        vals = A.data[A.indptr[r] : A.indptr[r + 1]]
        lo, hi = float(row_lower[r]), float(row_upper[r])
        if row_whole[r]:
            add(cols.tolist(), np.round(vals).astype(np.int64).tolist(), math.ceil(lo - 1e-9) if lo > -np.inf else -big, math.floor(hi + 1e-9) if hi < np.inf else big)
            continue
        s = _scale(np.concatenate([vals, [v for v in (lo, hi) if np.isfinite(v)]]))
        if hi < np.inf:  # floor(s a) x <= s a x <= s hi, an integer: <= floor(s hi)
            add(cols.tolist(), np.floor(s * vals).astype(np.int64).tolist(), -big, math.floor(s * hi))
        if lo > -np.inf:
            add(cols.tolist(), np.ceil(s * vals).astype(np.int64).tolist(), math.ceil(s * lo), big)
    scale = _scale(np.asarray(c))
    costly = np.flatnonzero(np.floor(scale * np.asarray(c)) != 0)
    if np.any(np.asarray(col_lower)[costly] < 0):
        raise ValueError("a costly column may be negative: rounding its cost down would not bound the objective")
    proto.objective.vars.extend(costly.tolist())
    proto.objective.coeffs.extend(np.floor(scale * np.asarray(c)[costly]).astype(np.int64).tolist())
    if hint is not None:
        proto.solution_hint.vars.extend(range(n))
        proto.solution_hint.values.extend(np.clip(np.round(hint), lows, highs).astype(np.int64).tolist())
    return model, scale


def solve_cpsat(
    c: np.ndarray, A: sp.spmatrix, row_lower: np.ndarray, row_upper: np.ndarray, col_lower: np.ndarray,
    col_upper: np.ndarray, integer: np.ndarray | None = None, time_limit_s: float = 10.0, workers: int = 1,
    hint: np.ndarray | None = None, mip_gap: float = 1e-6, parameters: dict | None = None,
) -> CpsatSolution:
    """Solve the problem with CP-SAT for ``time_limit_s`` (the solve itself, after building its model) on
    ``workers`` threads, from ``hint``; its bound is valid for the original problem (module docstring).
    ``parameters``: more of CP-SAT's parameters by name."""
    cp_model = _cp_model()
    model, scale = cp_model_of(c, A, row_lower, row_upper, col_lower, col_upper, integer, hint)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    solver.parameters.relative_gap_limit = float(mip_gap)
    for name, value in (parameters or {}).items():
        if isinstance(value, list):
            getattr(solver.parameters, name).extend(value)
        else:
            setattr(solver.parameters, name, value)
    started = time.perf_counter()
    status = solver.solve(model)
    seconds = time.perf_counter() - started
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}.get(status, "unknown")
    x = None
    objective = None
    loss = 0.0
    if name in ("optimal", "feasible"):
        x = np.asarray(solver.response_proto.solution, dtype=float)
        objective = float(np.asarray(c) @ x)
        loss = objective - float(np.floor(scale * np.asarray(c)) @ x) / scale
    bound = -np.inf if name in ("unknown", "infeasible") and not np.isfinite(solver.best_objective_bound) else float(solver.best_objective_bound) / scale
    if name == "optimal" and mip_gap > 0:  # stopped on its gap: the incumbent less what the gap allows
        bound = min(bound, float(np.floor(scale * np.asarray(c)) @ x) / scale)
    return CpsatSolution(name, x, objective, bound, seconds, loss)


def interval_bound_cpsat(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0, workers: int = 1, mip_gap: float = 1e-9) -> IntervalBound:
    """The interval relaxation with the idle-gap and kept-through rows (NOTE 5, 7, 8), solved by CP-SAT:
    a lower bound (J) on POET's optimum, and its best solution made into a schedule (replay it). With one
    worker, CP-SAT's LP holds every row (``linearization_level`` 2); measured (NOTE 14) it proves the
    relaxation's optimum on bert/m4 at its smallest footprint, where HiGHS stays in its root, and is
    weaker than HiGHS elsewhere."""
    started = time.perf_counter()
    trivial = costs.plain_step_energy_j
    problem = interval_problem(graph, costs, options)
    if problem is None:
        return IntervalBound(trivial, True, None, 0, 0, time.perf_counter() - started)
    A, lower, upper = problem.A, problem.row_lower, problem.row_upper
    if problem.runtime is not None:
        A = sp.vstack([A, sp.csr_matrix(problem.runtime[None, :])]).tocsr()
        lower, upper = np.append(lower, -np.inf), np.append(upper, problem.slack_s)
    n = problem.cost.size
    found = solve_cpsat(problem.cost, A, lower, upper, np.zeros(n), problem.upper, time_limit_s=time_limit_s, workers=workers, mip_gap=mip_gap, parameters={"linearization_level": 2})
    log.info("interval bound by CP-SAT: %s, bound %.6f, best %s plain steps, %.1f s", found.status, 1 + found.bound, "none" if found.objective is None else f"{1 + found.objective:.6f}", found.seconds)
    schedule = None if found.x is None else interval_schedule(graph, problem, found.x > 0.5)
    incumbent = None if found.objective is None else 1.0 + found.objective
    size = (n, A.shape[0])
    if found.status == "infeasible":
        return IntervalBound(trivial, False, None, *size, time.perf_counter() - started)
    return IntervalBound(trivial * (1.0 + max(0.0, found.bound)), found.status == "optimal", schedule, *size, time.perf_counter() - started, incumbent)

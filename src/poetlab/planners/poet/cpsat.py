"""OR-Tools CP-SAT on an integer program given as sparse rows, and on the interval relaxation (NOTE 14 in
docs/solve.md), in a worker process of its own.

CP-SAT (the solver Moccasin, Bartan et al. 2023, used for rematerialization) takes integer coefficients only. The
worker (``_cpsat_worker.py``, run like the HiGHS worker: ``python -I path PARENT_PID``, numpy and OR-Tools only)
turns ``min c @ x, row_lower <= A @ x <= row_upper, col_lower <= x <= col_upper`` into a CP-SAT model whose
optimum, and whose proven bound, is never above the original's (integral rows kept, the runtime row and the costs
scaled by a power of two and rounded so that they only loosen; its docstring), so a bound read from it is a valid
lower bound. It runs apart because libortools and highspy each bundle their own HiGHS library and cannot be loaded
in one process, and ``solve`` loads highspy; this module never imports OR-Tools. Every column must be integer (the
interval relaxation's are all binary; POET's full MILP, with its continuous U columns, was not tried: NOTE 14).

A solution is checked against the original rows by the caller (for POET: made into a schedule and replayed by the
simulator).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.errors import PoetlabError
from poetlab.planners.poet.backends import run_worker
from poetlab.planners.poet.intervals import IntervalBound, interval_point, interval_problem, interval_schedule
from poetlab.planners.poet.milp import MilpOptions

log = logging.getLogger("poetlab.bounds")

#: the CP-SAT worker script, run by path in isolated mode (`python -I`)
WORKER_PATH = Path(__file__).with_name("_cpsat_worker.py")
_PROBE_S = 30.0  # what the probe (start, import OR-Tools) may take


class CpsatUnavailableError(PoetlabError):
    """OR-Tools is not installed where the CP-SAT worker looks."""


def _ortools_path() -> list[str]:
    """Where this process would import OR-Tools from (e.g. its PYTHONPATH, which the isolated worker does not
    read), found without importing it: the worker appends it to its own path."""
    try:
        spec = importlib.util.find_spec("ortools")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [os.path.dirname(os.path.abspath(next(iter(spec.submodule_search_locations))))]


@functools.lru_cache(maxsize=1)
def cpsat_available() -> tuple[bool, str]:
    """(whether the CP-SAT worker loads OR-Tools, why): one worker start that imports it (about a second), once."""
    try:
        answer = run_worker(WORKER_PATH, {"probe": True, "path": _ortools_path()}, _PROBE_S, "CP-SAT")
    except PoetlabError as error:  # (a worker that died importing it: its last line)
        return False, f"OR-Tools did not load ({error})"
    if answer.status.startswith("available"):
        return True, f"OR-Tools {answer.status.split(': ', 1)[1]}"
    return False, f"OR-Tools not installed (pip install ortools; {answer.status.split(': ', 2)[-1]})"


@dataclass(frozen=True)
class CpsatSolution:
    """CP-SAT's answer: ``status`` (optimal | feasible | infeasible | unknown), its best solution ``x``
    (None if none) and its objective ``c @ x`` in the caller's units, ``bound`` a proven lower bound on
    ``c @ x`` over the original rows (-inf where CP-SAT proved none), and the seconds its worker took."""

    status: str
    x: np.ndarray | None
    objective: float | None
    bound: float
    seconds: float


def solve_cpsat(
    c: np.ndarray, A: sp.spmatrix, row_lower: np.ndarray, row_upper: np.ndarray, col_lower: np.ndarray,
    col_upper: np.ndarray, integer: np.ndarray | None = None, time_limit_s: float = 10.0, workers: int = 1,
    hint: np.ndarray | None = None, mip_gap: float = 1e-6, parameters: dict | None = None, target: float | None = None,
) -> CpsatSolution:
    """Solve the problem with CP-SAT in its worker for ``time_limit_s`` (building its model included) on
    ``workers`` threads, from ``hint``; its bound is valid for the original problem (module docstring).
    ``parameters``: more of CP-SAT's parameters by name; ``target``: stop once the bound reaches it (the
    caller's certificate). CpsatUnavailableError where OR-Tools is not installed."""
    A = sp.csr_matrix(A)
    if integer is not None and not np.all(integer):
        raise ValueError("CP-SAT holds integer columns only")
    request = {
        "c": np.asarray(c, dtype=float), "A_csr": (A.indptr, A.indices, A.data.astype(float)), "row_lower": np.asarray(row_lower, dtype=float),
        "row_upper": np.asarray(row_upper, dtype=float), "col_lower": np.asarray(col_lower, dtype=float), "col_upper": np.asarray(col_upper, dtype=float),
        "time_limit_s": float(time_limit_s), "workers": int(workers), "hint": hint, "mip_gap": float(mip_gap), "parameters": parameters or {},
        "target": target, "path": _ortools_path(),
    }
    answer = run_worker(WORKER_PATH, request, time_limit_s, "CP-SAT")
    if answer.status.startswith("error: unavailable"):
        raise CpsatUnavailableError(f"CP-SAT needs OR-Tools: pip install ortools ({answer.status[20:]})")
    if answer.status.startswith("error"):
        raise ValueError(answer.status[7:])
    status = {"time_limit": "feasible" if answer.x is not None else "unknown"}.get(answer.status, answer.status)
    bound = -np.inf if answer.bound is None else float(answer.bound)
    return CpsatSolution(status, answer.x, answer.objective, bound, answer.solve_time_s)


def interval_bound_cpsat(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0, workers: int = 1, mip_gap: float = 1e-9,
    start: Schedule | None = None, target_j: float | None = None, max_columns: int | None = None,
) -> IntervalBound:
    """The interval relaxation with the idle-gap and kept-through rows (NOTE 5, 7, 8), solved by CP-SAT:
    a lower bound (J) on POET's optimum, and its best solution made into a schedule (replay it). With one
    worker, CP-SAT's LP holds every row (``linearization_level`` 2), and without CP-SAT's presolve (on bert/m4 at
    its smallest footprint it reached the bound that certifies in 14.5 s instead of 34.4 s); measured (NOTE 14) it
    proves the relaxation's optimum there, where HiGHS stays in its root, and is weaker than HiGHS elsewhere. ``start``: a schedule whose point (:func:`interval_point`) is CP-SAT's hint;
    ``target_j``: stop once the bound reaches it. ``time_limit_s`` counts the relaxation's build. Above
    ``max_columns`` it is not solved (the trivial bound; NOTE 14: CP-SAT's presolve took 16 s on resnet50's 84k)."""
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
    if max_columns is not None and n > max_columns:
        log.info("interval bound by CP-SAT: skipped, %d columns (more than %d)", n, max_columns)
        return IntervalBound(trivial, False, None, n, A.shape[0], time.perf_counter() - started)
    hint = None if start is None else interval_point(graph, problem, start)
    target = None if target_j is None else target_j / trivial - 1.0
    left_s = max(0.1, time_limit_s - (time.perf_counter() - started))
    found = solve_cpsat(problem.cost, A, lower, upper, np.zeros(n), problem.upper, time_limit_s=left_s, workers=workers, hint=hint, mip_gap=mip_gap, parameters={"linearization_level": 2, "cp_model_presolve": False}, target=target)
    log.info("interval bound by CP-SAT: %s, bound %.6f, best %s plain steps, %.1f s", found.status, 1 + found.bound, "none" if found.objective is None else f"{1 + found.objective:.6f}", found.seconds)
    schedule = None if found.x is None else interval_schedule(graph, problem, found.x > 0.5)
    incumbent = None if found.objective is None else 1.0 + found.objective
    size = (n, A.shape[0])
    if found.status == "infeasible":
        return IntervalBound(trivial, False, None, *size, time.perf_counter() - started)
    return IntervalBound(trivial * (1.0 + max(0.0, found.bound)), found.status == "optimal", schedule, *size, time.perf_counter() - started, incumbent)

"""The CP-SAT child process, run as a script in isolated mode: ``python -I path/to/_cpsat_worker.py PARENT_PID``.

It imports numpy and OR-Tools only, never poetlab, and never highspy: libortools and highspy each bundle their
own HiGHS library and cannot be loaded in one process (undefined symbols either way), and ``solve`` loads highspy
(docs/solve.md, NOTE 14). Like the HiGHS worker it runs isolated (no working directory on ``sys.path``); the
request may name directories to append to ``sys.path`` (where the parent finds OR-Tools, e.g. on its
``PYTHONPATH``), after the environment's own, so they cannot stand in for numpy.

Reads one pickled request (see :func:`poetlab.planners.poet.cpsat.solve_cpsat`): ``min c @ x, row_lower <= A @ x
<= row_upper, col_lower <= x <= col_upper``, x integer, A as CSR arrays, in plain numpy arrays, with a hint,
a time limit, a relative gap, a target bound and CP-SAT's parameters; ``{"probe": True}`` only imports OR-Tools
and answers 'available: VERSION'. Streams through ``_worker_io.py`` (loaded by path; it also ends the worker with its
parent): ('incumbent', c @ x, x) for each improving solution, ('bound', b) at most twice a second, and ('done',
status, objective, bound, x); statuses optimal | feasible | infeasible | time_limit, or 'error: unavailable: why'
where OR-Tools does not load.

The model (:func:`cp_model_of`) has an optimum, and a proven bound, never above the original's, so a bound read
from it is a valid lower bound:

- a row whose coefficients are integers is kept as it is (its bounds rounded inwards: the activity of
  integers is an integer);
- any other row (POET's runtime row, in seconds) is scaled by a power of two and rounded so that it
  only loosens: ``floor(s a) @ x <= floor(s upper)`` and ``ceil(s a) @ x >= ceil(s lower)`` (x >= 0);
- the objective is scaled by a power of two and its costs rounded down, so the integer objective over
  the scale is at most ``c @ x`` at every x >= 0; the loss at a solution is at most its number of
  costly columns set, over the scale.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path

_COEFF_BITS = 30  # a scaled row or objective's largest coefficient is below 2**_COEFF_BITS
_BOUND_EVERY_S = 0.5


def _scale(values) -> float:
    import numpy as np

    biggest = float(np.abs(values).max()) if values.size else 0.0
    return 1.0 if biggest == 0 else 2.0 ** math.floor(_COEFF_BITS - math.log2(biggest))


def cp_model_of(cp_model, request: dict):
    """The CP-SAT model of the request (module docstring) and the objective's scale (integer objective =
    ``floor(scale * c) @ x``). ValueError for a problem it cannot hold."""
    import numpy as np

    c, (indptr, indices, data) = np.asarray(request["c"], dtype=float), request["A_csr"]
    row_lower, row_upper = request["row_lower"], request["row_upper"]
    col_lower, col_upper = np.asarray(request["col_lower"], dtype=float), np.asarray(request["col_upper"], dtype=float)
    n, m = c.size, len(row_lower)
    if not (np.all(np.isfinite(col_lower)) and np.all(np.isfinite(col_upper))):
        raise ValueError("CP-SAT needs finite column bounds")
    whole = np.abs(data - np.round(data)) <= 1e-9 * np.maximum(1.0, np.abs(data))
    row_of = np.repeat(np.arange(m), np.diff(indptr))
    row_whole = np.ones(m, dtype=bool)
    row_whole[row_of[~whole]] = False
    if np.any(col_lower[np.unique(indices[~row_whole[row_of]])] < 0):
        raise ValueError("a row with fractional coefficients holds a column that may be negative")
    model = cp_model.CpModel()
    proto = model.proto
    lows = np.ceil(col_lower - 1e-9).astype(np.int64)
    highs = np.floor(col_upper + 1e-9).astype(np.int64)
    for lo, hi in zip(lows.tolist(), highs.tolist()):
        proto.variables.add().domain.extend([lo, hi])
    big = cp_model.INT_MAX // 4

    def add(cols, coeffs, lo, hi) -> None:
        ct = proto.constraints.add().linear
        ct.vars.extend(cols)
        ct.coeffs.extend(coeffs)
        ct.domain.extend([lo, hi])

    for r in range(m):
        cols, vals = indices[indptr[r] : indptr[r + 1]], data[indptr[r] : indptr[r + 1]]
        lo, hi = float(row_lower[r]), float(row_upper[r])
        if row_whole[r]:
            add(cols.tolist(), np.round(vals).astype(np.int64).tolist(), math.ceil(lo - 1e-9) if lo > -np.inf else -big, math.floor(hi + 1e-9) if hi < np.inf else big)
            continue
        s = _scale(np.concatenate([vals, [v for v in (lo, hi) if np.isfinite(v)]]))
        if hi < np.inf:  # floor(s a) x <= s a x <= s hi, an integer: <= floor(s hi)
            add(cols.tolist(), np.floor(s * vals).astype(np.int64).tolist(), -big, math.floor(s * hi))
        if lo > -np.inf:
            add(cols.tolist(), np.ceil(s * vals).astype(np.int64).tolist(), math.ceil(s * lo), big)
    scale = _scale(c)
    costly = np.flatnonzero(np.floor(scale * c) != 0)
    if np.any(col_lower[costly] < 0):
        raise ValueError("a costly column may be negative: rounding its cost down would not bound the objective")
    proto.objective.vars.extend(costly.tolist())
    proto.objective.coeffs.extend(np.floor(scale * c[costly]).astype(np.int64).tolist())
    hint = request.get("hint")
    if hint is not None:
        proto.solution_hint.vars.extend(range(n))
        proto.solution_hint.values.extend(np.clip(np.round(hint), lows, highs).astype(np.int64).tolist())
    return model, scale


def _solve(cp_model, request: dict, messages, send, started: float) -> tuple:
    import numpy as np

    try:
        model, scale = cp_model_of(cp_model, request)
    except ValueError as error:
        return ("done", f"error: {error}", None, None, None)
    c = np.asarray(request["c"], dtype=float)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(request["time_limit_s"]) - (time.monotonic() - started))  # (the model's build counts)
    solver.parameters.num_workers = int(request["workers"])
    solver.parameters.relative_gap_limit = float(request["mip_gap"])
    for name, value in request.get("parameters", {}).items():
        if isinstance(value, list):
            getattr(solver.parameters, name).extend(value)
        else:
            setattr(solver.parameters, name, value)
    target = request.get("target")
    reported = [-math.inf]

    def on_bound(value: float) -> None:
        now = time.monotonic()
        if now - reported[0] >= _BOUND_EVERY_S:
            reported[0] = now
            send(messages, ("bound", value / scale))
        if target is not None and value / scale >= target:
            solver.stop_search()  # the caller's certificate

    class Incumbents(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            x = np.asarray(self.response_proto.solution, dtype=float)
            send(messages, ("incumbent", float(c @ x), x))

    solver.best_bound_callback = on_bound
    status = solver.solve(model, Incumbents())
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}.get(status, "time_limit")
    x = objective = None
    if name in ("optimal", "feasible"):
        x = np.asarray(solver.response_proto.solution, dtype=float)
        objective = float(c @ x)
    bound = float(solver.best_objective_bound) / scale if math.isfinite(solver.best_objective_bound) else None
    if name == "optimal" and request["mip_gap"] > 0:  # stopped on its gap: the incumbent less what the gap allows
        bound = min(bound, float(np.floor(scale * c) @ x) / scale)
    return ("done", name, objective, None if name == "infeasible" else bound, x)


def main(argv: list[str]) -> None:
    started = time.monotonic()
    spec = importlib.util.spec_from_file_location("_worker_io", Path(__file__).with_name("_worker_io.py"))  # (by path: -I)
    io = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(io)
    request, messages = io.begin(argv)
    sys.path.extend(path for path in request.get("path", ()) if path not in sys.path)
    try:
        from ortools import __version__ as version
        from ortools.sat.python import cp_model
    except ImportError as error:
        io.send(messages, ("done", f"error: unavailable: {error}", None, None, None))
        return
    io.send(messages, ("done", f"available: {version}", None, None, None) if request.get("probe") else _solve(cp_model, request, messages, io.send, started))
    messages.close()


if __name__ == "__main__":
    main(sys.argv[1:])

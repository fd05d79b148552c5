"""MILP backends behind one interface: HiGHS (default, always available) and Gurobi (when licensed).

``run_milp(model, solver=...)`` returns a :class:`MilpSolution` whatever the backend. HiGHS runs in a
child process (``python -I .../_highs_worker.py PARENT_PID``, numpy and highspy only) that streams every improving solution back, and the parent kills it if it outlives its
time limit (:func:`run_worker`, which also runs the CP-SAT worker of :mod:`poetlab.planners.poet.cpsat`): HiGHS does not always honour ``time_limit`` (it can sit in presolve or the root LP far past
it), and a solve that must end has to be stoppable from outside. Gurobi honours its limit and runs
in-process.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from poetlab.errors import InvalidArgumentError, PoetlabError
from poetlab.planners.poet.milp import MilpModel
from poetlab.progress import progress_bar

log = logging.getLogger("poetlab.solvers")

SOLVERS = ("auto", "highs", "gurobi")
#: the size-limited license bundled with the gurobipy wheel
GUROBI_SIZE_LIMIT = 2000
_GRACE_S = 0.5  # past its time limit, HiGHS gets this long (or a tenth of the limit) before it is killed


class SolverUnavailableError(PoetlabError):
    """The requested solver cannot run here (not installed, no license, or a size-limited license)."""


@dataclass(frozen=True)
class MilpSolution:
    """A backend's answer. ``status``: optimal | feasible | infeasible | time_limit.

    ``x`` is the best solution found (None when there is none); ``bound`` the best proven lower bound.
    """

    status: str
    solver: str
    x: np.ndarray | None
    objective: float | None
    bound: float | None
    gap: float | None
    solve_time_s: float


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    return max(0.0, (objective - bound) / max(abs(objective), 1e-300))


# ---- Gurobi ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def gurobi_license() -> tuple[str, str]:
    """('full' | 'size-limited' | 'none', why). Probes by optimizing a 2001-variable LP (about 0.1 s)."""
    try:
        import gurobipy as gp
    except ImportError:
        return "none", "gurobipy is not installed"
    try:
        with gp.Env(params={"OutputFlag": 0}) as env, gp.Model(env=env) as model:
            model.addMVar(GUROBI_SIZE_LIMIT + 1, lb=0.0)
            model.optimize()
        return "full", "a Gurobi license covers models of any size"
    except gp.GurobiError as exc:
        if exc.errno == gp.GRB.Error.SIZE_LIMIT_EXCEEDED:
            return "size-limited", f"Gurobi license is size-limited ({GUROBI_SIZE_LIMIT} variables and constraints)"
        if exc.errno == gp.GRB.Error.NO_LICENSE:
            return "none", "no Gurobi license found"
        return "none", f"Gurobi is unusable ({exc})"


def choose_solver(model: MilpModel, solver: str) -> str:
    """Resolve ``auto`` to a backend and log which and why; check an explicit choice can run."""
    if solver not in SOLVERS:
        raise InvalidArgumentError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    if solver == "highs":
        log.info("using HiGHS (asked for)")
        return "highs"
    kind, why = gurobi_license()
    # (Gurobi gets a row bounded on both sides as two constraints, see _solve_gurobi: count them as it will)
    rows = int(np.isfinite(model.row_upper).sum() + np.isfinite(model.row_lower).sum())
    fits = model.n_cols <= GUROBI_SIZE_LIMIT and rows <= GUROBI_SIZE_LIMIT
    size = f"this model has {model.n_cols} variables and {rows} constraints"
    if solver == "gurobi":
        if kind == "none":
            raise SolverUnavailableError(f"{why}; install a Gurobi license or use --solver highs")
        if kind == "size-limited" and not fits:
            raise SolverUnavailableError(f"{why} and {size}; install a full license or use --solver highs")
        log.info("using Gurobi (asked for)")
        return "gurobi"
    if kind == "full" or (kind == "size-limited" and fits):
        log.info("using Gurobi: %s", why if kind == "full" else f"{why} and {size}, which fits")
        return "gurobi"
    log.info("using HiGHS: %s", f"{why} and {size}" if kind == "size-limited" else why)
    return "highs"


def _solve_gurobi(
    model: MilpModel, time_limit_s: float, mip_gap: float, threads: int | None, verbose: bool, start: np.ndarray | None, stop_at: float | None = None
) -> MilpSolution:
    import gurobipy as gp
    from gurobipy import GRB

    started = time.perf_counter()
    with gp.Env(params={"OutputFlag": int(verbose)}) as env, gp.Model(env=env) as m:
        vtype = np.where(model.integer, GRB.BINARY, GRB.CONTINUOUS)
        x = m.addMVar(model.n_cols, lb=model.col_lower, ub=model.col_upper, vtype=vtype)
        finite_upper = np.isfinite(model.row_upper)
        finite_lower = np.isfinite(model.row_lower)
        if finite_upper.any():
            m.addMConstr(model.A[finite_upper], x, "<", model.row_upper[finite_upper])
        if finite_lower.any():
            m.addMConstr(model.A[finite_lower], x, ">", model.row_lower[finite_lower])
        m.setMObjective(None, model.c, 0.0, sense=GRB.MINIMIZE)
        if start is not None:
            x.Start = start
        m.Params.TimeLimit = time_limit_s
        m.Params.MIPGap = mip_gap
        m.Params.Seed = 0
        if stop_at is not None:
            m.Params.BestObjStop = stop_at  # an incumbent this good is optimal by the caller's bound
        if threads:
            m.Params.Threads = threads
        m.optimize()
        elapsed = time.perf_counter() - started
        if m.Status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
            return MilpSolution("infeasible", "gurobi", None, None, None, None, elapsed)
        has = m.SolCount > 0
        objective = float(m.ObjVal) if has else None
        bound = float(m.ObjBound) if m.IsMIP else objective
        status = "optimal" if m.Status in (GRB.OPTIMAL, GRB.USER_OBJ_LIMIT) else ("time_limit" if m.Status == GRB.TIME_LIMIT else "feasible")
        if not has and status != "time_limit":
            status = "infeasible"
        return MilpSolution(status, "gurobi", np.array(x.X) if has else None, objective, bound, relative_gap(objective, bound) if has else None, elapsed)


# ---- HiGHS ------------------------------------------------------------------------------------
#: the HiGHS worker script, run by path in isolated mode (`python -I`): never a `poetlab/` of the current directory
WORKER_PATH = Path(__file__).with_name("_highs_worker.py")


def _read_messages(stream, inbox: queue.Queue) -> None:
    """Reader thread: length-prefixed pickles from the worker into ``inbox``; None at end of stream."""
    try:
        while header := stream.read(8):
            (size,) = struct.unpack("<Q", header)
            inbox.put(pickle.loads(stream.read(size)))
    except (OSError, EOFError, pickle.UnpicklingError, struct.error):
        pass
    finally:
        inbox.put(None)


def _read_stderr(stream, tail: collections.deque, echo: bool) -> None:
    """Reader thread: the worker's stderr (HiGHS's log when verbose), echoed when asked; the last
    lines kept to explain a worker that dies."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        if line:
            tail.append(line)
        if echo:
            print(line, file=sys.stderr)


def _solve_highs(
    model: MilpModel, time_limit_s: float, mip_gap: float, threads: int | None, verbose: bool, start: np.ndarray | None,
    stop_at: float | None = None, options: dict | None = None,
) -> MilpSolution:
    """HiGHS in a worker process (``python -I``, imports numpy and highspy only), killed if it outlives
    its time limit. ``stop_at``: an objective value that proves optimality within ``mip_gap`` (from a
    bound the solver does not know): an incumbent at or below it ends the solve as optimal."""
    A = model.A.tocsc()
    request = {
        "c": model.c, "A_csc": (A.indptr, A.indices, A.data), "row_lower": model.row_lower, "row_upper": model.row_upper,
        "col_lower": model.col_lower, "col_upper": model.col_upper, "integer": model.integer, "time_limit_s": time_limit_s,
        "mip_gap": mip_gap, "threads": threads, "verbose": verbose, "start": start, "options": options or {},
    }
    answer = run_worker(WORKER_PATH, request, time_limit_s, "HiGHS", verbose, stop_at)
    if answer.status.startswith("error"):
        raise PoetlabError(f"HiGHS failed ({answer.status[7:]}); try --solver gurobi or another time limit")
    return answer


def run_worker(worker: Path, request: dict, time_limit_s: float, name: str, verbose: bool = False, stop_at: float | None = None) -> MilpSolution:
    """Run the solver worker script ``worker`` (``python -I worker PARENT_PID``: the HiGHS worker, the CP-SAT
    worker) on ``request``, and gather its messages (``_worker_io.py``): the best incumbent and the last bound it
    reported are kept if it must be killed, ``time_limit_s`` plus a grace after it started. ``name`` (HiGHS,
    CP-SAT) names it in the progress bar and the log; the answer's ``solver`` is that name in lower case, without
    dashes; its status may be the worker's 'error: why'. ``stop_at``: an incumbent at or below it ends the solve
    as optimal. A worker that exits without an answer is a PoetlabError with its stderr's last line."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-I", str(worker), str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    inbox: queue.Queue = queue.Queue()
    tail: collections.deque = collections.deque(maxlen=5)
    readers = [
        threading.Thread(target=_read_messages, args=(process.stdout, inbox), daemon=True),
        threading.Thread(target=_read_stderr, args=(process.stderr, tail, verbose), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = started + time_limit_s + max(_GRACE_S, 0.1 * time_limit_s)
    best_objective: float | None = None
    best_x: np.ndarray | None = None
    best_bound: float | None = None  # the last dual bound the worker reported, kept if it must be killed
    final = None
    killed = False
    label = name.lower().replace("-", "")
    # elapsed seconds against the time limit, and the best energy so far; silent when not on a terminal
    progress = progress_bar(total=round(time_limit_s), unit="s", desc=name, leave=False, disable=None, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}")
    try:
        try:
            pickle.dump(request, process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            process.stdin.close()
        except BrokenPipeError:
            pass
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                log.warning("%s ignored its %g s time limit; stopped it and kept the best solution so far", name, time_limit_s)
                killed = True
                break
            progress.n = min(time.perf_counter() - started, progress.total)
            progress.refresh()
            try:
                message = inbox.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if message is None:
                break
            if message[0] == "bound":
                best_bound = message[1] if best_bound is None else max(best_bound, message[1])
                continue
            if message[0] == "incumbent":
                if best_objective is None or message[1] < best_objective:
                    best_objective, best_x = message[1], message[2]
                    progress.set_postfix_str(f"best {best_objective:.8g}")
                if stop_at is not None and best_objective <= stop_at:
                    final = ("done", "optimal", best_objective, None, best_x)  # the caller's bound proves it
                    break
            else:
                final = message
    finally:
        progress.close()
        if process.poll() is None:
            process.kill()
        process.wait()
        for reader in readers:
            reader.join(timeout=5)
    elapsed = time.perf_counter() - started
    if final is None:
        if not killed:
            why = tail[-1] if tail else "no output on stderr"
            raise PoetlabError(f"the {name} worker exited (code {process.returncode}) without an answer: {why}")
        return MilpSolution("time_limit", label, best_x, best_objective, best_bound, relative_gap(best_objective, best_bound), elapsed)
    _, status, objective, bound, x = final
    if status.startswith("error"):
        return MilpSolution(status, label, None, None, None, None, elapsed)
    if bound is None and best_bound is not None and status != "infeasible":
        bound = best_bound
    if x is None and best_x is not None:
        x, objective = best_x, best_objective
    if x is None:
        return MilpSolution(status, label, None, None, bound, None, elapsed)
    return MilpSolution(status, label, x, objective, bound, relative_gap(objective, bound), elapsed)


def run_milp(
    model: MilpModel,
    solver: str = "auto",
    time_limit_s: float = 600.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    verbose: bool = False,
    start: np.ndarray | None = None,
    lower_bound: float | None = None,
) -> MilpSolution:
    """Solve ``model`` with the chosen backend (``auto``: Gurobi when its license covers the model),
    from the feasible solution ``start`` where one is given.

    The backends see the objective divided by :attr:`MilpModel.energy_scale` (one plain step's energy), so
    that their absolute tolerances mean the same on every platform (in joules, an objective of 1e-4 J sits
    inside HiGHS's default absolute gap; NOTE 1 in docs/solve.md). ``lower_bound`` is a bound proven
    elsewhere (the caller's): it raises the reported bound, and a solution within ``mip_gap`` of it ends
    the solve as optimal."""
    backend = choose_solver(model, solver)
    scale = model.energy_scale
    scaled = dataclasses.replace(model, c=model.c / scale)
    stop_at = None if lower_bound is None else lower_bound / scale * (1 + 1e-12) / (1 - mip_gap)
    if backend == "gurobi":
        answer = _solve_gurobi(scaled, time_limit_s, mip_gap, threads, verbose, start, stop_at)
    else:
        answer = _solve_highs(scaled, time_limit_s, mip_gap, threads, verbose, start, stop_at)
    objective = None if answer.objective is None else answer.objective * scale
    bound = None if answer.bound is None else answer.bound * scale
    if lower_bound is not None and answer.status != "infeasible":
        bound = lower_bound if bound is None else max(bound, lower_bound)
    gap = relative_gap(objective, bound)
    status = "optimal" if answer.x is not None and gap is not None and gap <= mip_gap else answer.status
    return dataclasses.replace(answer, status=status, objective=objective, bound=bound, gap=gap)

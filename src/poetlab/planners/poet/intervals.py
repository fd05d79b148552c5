"""The interval relaxation: the eviction bound with a recomputation's inputs charged (NOTE 5 in docs/solve.md),
and the schedules its solutions make.

The eviction bound (:mod:`poetlab.planners.poet.bounds`, NOTE 2) lets a tensor that the budget cannot
hold across a stage be regenerated once, for its own rerun's price, whatever that rerun needs. Here the
stages over budget, t_1 < ... < t_m, cut the step into intervals (t_a, t_{a+1}], and per row stage t_a
and tensor j there are three choices:

- H[j, a]: j is held at the end of stage t_a's computation (kept for stage t_a + 1); its bytes count in
  stage t_a's memory row, beside node t_a's output, inputs and workspace;
- RC[j, a]: j is recomputed in a stage of interval a (t_a + 1 .. t_{a+1});
- PG[j, a]: j is paged in in a stage t_a .. t_{a+1} - 1 (and out once, before).

A tensor read in interval a is held at t_a or regenerated in interval a; held at t_{a+1}, it was in RAM
in interval a; recomputed in interval a, its inputs are in RAM in interval a. Each RC and PG is priced
(and timed against the runtime budget's slack) once per interval, so a tensor needed in two intervals is
held across the row stage between them or regenerated twice. Every schedule of POET's MILP maps to a
point of this MILP at no more than its energy (NOTE 5), so its optimum, or a stopped solve's dual bound,
is a lower bound: :func:`interval_bound`.

Where two row stages follow each other the intervals are single stages, and the kept-through rows
(:func:`_kept_through`, NOTE 8) say that a tensor in RAM in one stage and paged in during it for the next is
held across it: at the smallest footprint, where nearly every stage is a row stage, they lift the bound
on resnet18_cifar/m4 from 1.26 to 1.36 plain steps, and on small graphs to the exact optimum.

A schedule maps to a point of it (:func:`interval_point`; :func:`interval_value` prices it): for a schedule of
POET's MILP the point meets every row at no more than its energy, which the tests check row by row on exact optima
(NOTE 10). That point starts HiGHS (``interval_bound(start=...)``, NOTE 13): near the bound, `solve` gives the
relaxation its best start, and on bert/jetsontx2 at its smallest footprint the relaxation without the kept-through
and idle-gap rows is then solved to its optimum in 3-4 s, and its schedule certifies the row.

What it does not see is RAM inside a stage while a recomputation runs; so a solution made into a
schedule (:func:`interval_schedule`) may exceed the budget there. :func:`interval_start` solves it at the
budget (the bound) and with the budget less a margin (the largest tensor, then half of it) for quick
starts that the caller replays: on resnet18_cifar/m4 at 10% and 1.05x its schedule costs 1.11 plain
steps, where the other starts and the window search gave 1.36.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph, min_footprint_bytes
from poetlab.planners.poet.bounds import eviction_demands, last_uses, proven_extra
from poetlab.planners.poet.idle_gaps import with_gap_rows
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.rows import SparseRows
from poetlab.core.schedule import Schedule

log = logging.getLogger("poetlab.bounds")


@dataclass(frozen=True)
class IntervalBound:
    """The bound (J); whether HiGHS proved the relaxation's optimum (else a stopped solve's dual bound);
    the relaxation's best solution made into a schedule (None if it found none; replay it: the
    relaxation does not see every moment's RAM); the problem's size and the seconds it took; and the
    best solution's objective in plain steps (None if none: the most this relaxation could prove)."""

    bound_j: float
    optimal: bool
    schedule: Schedule | None
    n_columns: int
    n_rows: int
    seconds: float
    incumbent: float | None = None


@dataclass
class _Problem:
    """The interval relaxation as arrays, and where each choice's column is."""

    stages: list[int]  # the row stages t_a, ascending
    tracked: list[list[int]]  # per row stage, the tensors it speaks of
    H: list[dict[int, int]]  # per row stage, tensor -> column of "held at the end of t_a"
    RC: list[dict[int, int]]  # per row stage, tensor -> column of "recomputed in stages t_a+1 .. t_{a+1}"
    PG: list[dict[int, int]]  # per row stage, tensor -> column of "paged in in stages t_a .. t_{a+1}-1"
    cost: np.ndarray
    upper: np.ndarray
    A: sp.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    runtime: np.ndarray | None  # per column, the seconds it takes from the runtime budget's slack
    slack_s: float
    #: with the idle-gap rows (:func:`poetlab.planners.poet.idle_gaps.with_gap_rows`): each gap (tensor, the use
    #: that ends it) -> its first row stage's index, in the order of its ZR and ZP columns (the problem's last)
    gaps: dict[tuple[int, int], int] | None = None
    #: per row stage, the index of its memory row (the only rows with byte coefficients: what a Lagrangian prices)
    memory: list[int] | None = None


def _build(graph: TrainingGraph, costs: CostModel, options: MilpOptions, kept_rows: bool = True) -> _Problem | None:
    fixed = (2 * graph.param_bytes if options.params_in_budget else 0) + graph.reserved_bytes
    budget = float(options.ram_budget_bytes) - fixed
    demands = [] if options.compression else eviction_demands(graph, budget)
    if not demands:
        return None
    T = graph.n_nodes
    b = graph.output_bytes_least.astype(float)  # (the least each output holds: the rows stay valid)
    w = graph.workspace_left_alone.astype(float)  # (the least the MILP counts: the rows stay valid)
    movable = ~graph.pinned
    can_recompute = movable & options.remat
    can_page = movable & options.paging
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    last_use = last_uses(graph)
    stages = [t for t, _, _ in demands]
    rooms = [room - w[t] for t, _, room in demands]  # U[t, t] holds node t's workspace too
    m = len(stages)
    # the tensors tracked at each row stage, last to first: needed after it (read later, or tracked at the
    # next row stage), closed under the inputs of those a recomputation may rebuild
    tracked: list[list[int]] = [[] for _ in range(m)]
    later: set[int] = set()
    for a in range(m - 1, -1, -1):
        t = stages[a]
        held = set(inputs[t])
        seeds = set(np.flatnonzero(last_use[:t] > t).tolist()) | {j for j in later if j < t}
        seen = {j for j in seeds if j not in held and b[j] > 0}
        queue = list(seen)
        while queue:
            i = queue.pop()
            if can_recompute[i]:
                for j in inputs[i]:
                    if j not in seen and j not in held and b[j] > 0:
                        seen.add(j)
                        queue.append(j)
        tracked[a] = sorted(seen)
        later = seen
    rows = SparseRows()
    memory: list[int] = []
    out_col = np.arange(T)  # paged out at least once
    n_cols = T
    col_cost = [costs.pageout_energy_j]
    col_upper = [can_page.astype(float)]
    col_time = [costs.pageout_time_s if options.count_paging_time else np.zeros(T)]
    H: list[dict[int, int]] = []
    RC: list[dict[int, int]] = []
    PG: list[dict[int, int]] = []
    for a in range(m):
        X = np.array(tracked[a], dtype=np.int64)
        n = X.size
        h, rc, pg = np.arange(n_cols, n_cols + 3 * n).reshape(3, n)
        n_cols += 3 * n
        H.append(dict(zip(X.tolist(), h.tolist())))
        RC.append({j: c for j, c, ok in zip(X.tolist(), rc.tolist(), can_recompute[X]) if ok})
        PG.append({j: c for j, c, ok in zip(X.tolist(), pg.tolist(), can_page[X]) if ok})
        col_cost += [np.zeros(n), costs.recompute_energy_j[X], costs.pagein_energy_j[X]]
        col_upper += [np.ones(n), can_recompute[X].astype(float), can_page[X].astype(float)]
        col_time += [np.zeros(n), costs.recompute_runtime_s[X], costs.pagein_time_s[X] if options.count_paging_time else np.zeros(n)]
    for a in range(m):
        t = stages[a]
        end = stages[a + 1] if a + 1 < m else T - 1  # interval a: stages t+1 .. end (recomputes), t .. end-1 (page-ins)

        def present(j: int) -> list[int]:  # in RAM somewhere in interval a: held at t's end, or regenerated in it
            return [H[a][j], RC[a].get(j, -1), PG[a].get(j, -1)]

        X = tracked[a]
        memory.append(rows.row([H[a][j] for j in X], b[X], -np.inf, rooms[a]))  # stage t's memory at the end of its computation
        for j in X:
            if any(t < k <= end for k in graph.consumers[j]):  # read in interval a
                rows.row(present(j), 1.0, 1.0, np.inf)
            if a + 1 < m and j in H[a + 1]:  # held at the next row stage: in RAM at its start, so present in interval a
                rows.row([H[a + 1][j], *present(j)], [1.0, -1.0, -1.0, -1.0], -np.inf, 0.0)
            if j in PG[a]:
                rows.row([PG[a][j], out_col[j]], [1.0, -1.0], -np.inf, 0.0)
        for i, column in RC[a].items():  # a recomputation in interval a needs its inputs there
            for j in inputs[i]:
                if j in H[a]:
                    rows.row([*present(j), column], [1.0, 1.0, 1.0, -1.0], 0.0, np.inf)
    if kept_rows:
        _kept_through(rows, stages, H, RC, PG, T)
    return _Problem(
        stages=stages, tracked=tracked, H=H, RC=RC, PG=PG, cost=np.concatenate(col_cost) / costs.plain_step_energy_j,
        upper=np.concatenate(col_upper), A=rows.matrix(n_cols), row_lower=rows.lower, row_upper=rows.upper,
        runtime=None if options.runtime_budget_factor is None else np.concatenate(col_time),
        slack_s=0.0 if options.runtime_budget_factor is None else (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s,
        memory=memory,
    )


def _kept_through(rows: SparseRows, stages: list[int], H: list[dict[int, int]], RC: list[dict[int, int]], PG: list[dict[int, int]], T: int) -> None:
    """The kept-through rows (NOTE 8 in docs/solve.md). Where intervals a and a + 1 are the single stages s and
    s + 1 (row stages t_a = s - 1, t_{a+1} = s, t_{a+2} = s + 1), a tensor j in RAM in stage s (kept into it:
    H[j, a]; paged in during stage s - 1: PG[j, a]; recomputed in it: RC[j, a]) and paged in during stage s for
    stage s + 1 (PG[j, a + 1]) is in RAM at s + 1's start and was in RAM in stage s, so FREE cannot release
    it in stage s: it is held at the end of s's computation, H[j, a + 1] = 1, and counts in s's memory row.
    Without them the relaxation pages a tensor in at every stage of the backward pass while counting it in
    none of their memory rows."""
    m = len(stages)
    for a in range(m - 1):
        s = stages[a + 1]
        after = stages[a + 2] if a + 2 < m else T - 1
        if s != stages[a] + 1 or after != s + 1:
            continue
        for j, column in PG[a + 1].items():
            if j in H[a]:
                for source in (H[a][j], PG[a].get(j, -1), RC[a].get(j, -1)):
                    if source >= 0:
                        rows.row([source, column, H[a + 1][j]], [1.0, 1.0, -1.0], -np.inf, 1.0)


def interval_bound(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0, mip_gap: float = 1e-6, gap_rows: bool = False, integral: bool = True,
    kept_rows: bool = True, start: Schedule | None = None, target_j: float | None = None, floor_j: float | None = None,
) -> IntervalBound:
    """A lower bound (J) on the energy of every schedule of POET's MILP under ``options``: one plain step
    plus the cheapest regenerations that keep every stage over budget within it, where a tensor needed
    in two intervals between such stages is held across the stage between them or regenerated in each,
    and a recomputation needs its inputs. The trivial bound where nothing is over budget or with compression.
    ``gap_rows``: with the idle-gap rows (:mod:`poetlab.planners.poet.idle_gaps`, NOTE 7: the same optimum, a
    stronger LP); ``integral=False``: its LP relaxation only (a weaker bound, no schedule); ``kept_rows=False``:
    without the kept-through rows (NOTE 8; a weaker relaxation, for measurements only).

    ``start``: a schedule whose point (:func:`interval_point`) HiGHS starts from where it meets every row (NOTE 13:
    an incumbent at about the schedule's energy from the first second, so HiGHS prunes from the root on);
    ``target_j``: stop as soon as the dual bound reaches it (the caller's certificate); ``floor_j``: stop as soon as
    HiGHS has a solution below it (the relaxation's optimum is then below it too, so its bound can prove nothing
    above ``floor_j``, the caller's bound: NOTE 15). With any of them, HiGHS runs through highspy (scipy's ``milp``
    takes no start and no callback), in this process, with the same options."""
    import time

    started = time.perf_counter()
    trivial = costs.plain_step_energy_j
    problem = _build(graph, costs, options, kept_rows)
    if problem is None:
        return IntervalBound(trivial, True, None, 0, 0, time.perf_counter() - started)
    if gap_rows:
        problem = with_gap_rows(graph, problem)
    n = problem.cost.size
    x0 = None if start is None else interval_point(graph, problem, start)
    if x0 is not None and not _meets_rows(problem, x0):
        log.info("interval relaxation: the start's point breaks a row; solved without it")
        x0 = None
    built_s = time.perf_counter() - started
    if start is not None or target_j is not None or floor_j is not None:
        log.info("interval relaxation built in %.1f s: %d columns, %d rows%s", built_s, n, problem.A.shape[0], "" if x0 is None else f", the start's point at {1 + float(problem.cost @ x0):.6f}")
        target = None if target_j is None else target_j / trivial - 1.0
        result = solve_highspy(problem, integral, time_limit_s - built_s, mip_gap, x0, target, None if floor_j is None else floor_j / trivial - 1.0)
    else:
        from scipy.optimize import Bounds, LinearConstraint, milp

        constraints = [LinearConstraint(problem.A, problem.row_lower, problem.row_upper)]
        if problem.runtime is not None:
            constraints.append(LinearConstraint(problem.runtime[None, :], -np.inf, problem.slack_s))
        result = milp(problem.cost, constraints=constraints, integrality=np.full(n, 1.0 if integral else 0.0), bounds=Bounds(np.zeros(n), problem.upper), options={"time_limit": time_limit_s, "mip_rel_gap": mip_gap})
    log.debug("interval bound: built in %.1f s, status %s, incumbent %s, dual bound %s", built_s, result.status, result.fun, getattr(result, "mip_dual_bound", None))
    schedule = None if result.x is None or not integral else interval_schedule(graph, problem, np.asarray(result.x) > 0.5)
    seconds = time.perf_counter() - started
    size = (n, problem.A.shape[0])
    incumbent = None if result.x is None or not integral else 1.0 + float(problem.cost @ np.asarray(result.x).round())
    if result.status == 2:
        log.info("interval bound: its relaxation is infeasible")
        return IntervalBound(trivial, False, None, *size, seconds)
    extra = proven_extra(result, mip_gap)
    if extra is None:
        return IntervalBound(trivial, False, schedule, *size, seconds, incumbent)
    return IntervalBound(trivial * (1.0 + max(0.0, extra)), result.status == 0 and integral, schedule, *size, seconds, incumbent)


def interval_point(graph: TrainingGraph, problem: _Problem, schedule: Schedule) -> np.ndarray | None:
    """The relaxation's point of a schedule (NOTE 5's map, with NOTE 8's page-ins that land something and NOTE 7's
    idle-gap columns): H[j, a] = S_RAM[t_a + 1, j] and (S_RAM[t_a, j] or R[t_a, j]); RC[j, a] = a rerun of j in
    stages t_a + 1 .. t_{a+1}; PG[j, a] = a page-in of j in stages t_a .. t_{a+1} - 1 after which j is in RAM at
    the next stage's start and was not at this one's (nor recomputed in it); O[j] = a page-out of j. For a schedule
    of POET's MILP it meets every row at no more than the schedule's energy above one plain step (NOTE 5, 7, 8):
    at most, not exactly, because a column prices a tensor once per interval (two reruns of j inside one interval,
    or a page-out repeated, count once), page-ins that land nothing and reruns of untracked tensors are not priced.
    Other schedules (DTR's, which frees a tensor one stage late for the MILP) may break a row (the caller checks).
    None for a schedule of another graph. It is how a schedule starts the relaxation (:func:`interval_bound`)."""
    T = graph.n_nodes
    if schedule.n_nodes != T:
        return None
    view = schedule.matrices()
    if view.R.shape[0] != T:
        return None
    R, S, M_IN, M_OUT = (np.asarray(matrix, dtype=bool) for matrix in (view.R, view.S_RAM, view.M_IN, view.M_OUT))
    lands = np.zeros_like(M_IN)
    lands[:-1] = M_IN[:-1] & S[1:] & ~S[:-1] & ~R[:-1]
    stages = problem.stages
    m = len(stages)
    x = np.zeros(problem.cost.size)
    x[:T] = M_OUT.any(axis=0)
    for a, t in enumerate(stages):
        end = stages[a + 1] if a + 1 < m else T - 1
        for j, col in problem.H[a].items():
            x[col] = S[t + 1, j] and (S[t, j] or R[t, j])
        for j, col in problem.RC[a].items():
            x[col] = R[t + 1 : end + 1, j].any()
        for j, col in problem.PG[a].items():
            x[col] = lands[t:end, j].any()
    if problem.gaps:
        n_gaps = len(problem.gaps)
        first = problem.cost.size - 2 * n_gaps
        for g, ((j, u), a0) in enumerate(problem.gaps.items()):
            x[first + g] = R[stages[a0] + 1 : u + 1, j].any()
            x[first + n_gaps + g] = lands[stages[a0] : u, j].any()
    return x


def interval_value(graph: TrainingGraph, costs: CostModel, options: MilpOptions, schedule: Schedule, gap_rows: bool = True, kept_rows: bool = True) -> float | None:
    """The relaxation's objective (J, one plain step included) at ``schedule``'s point (:func:`interval_point`), or
    None where that point breaks a row; one plain step where nothing is over budget (or with compression). For a
    schedule of POET's MILP it is never None and never above the schedule's energy: NOTE 5, 7 and 8's arguments,
    checked row by row on exact optima by the tests (NOTE 10)."""
    problem = _build(graph, costs, options, kept_rows)
    if problem is None:
        return costs.plain_step_energy_j
    if gap_rows:
        problem = with_gap_rows(graph, problem)
    x = interval_point(graph, problem, schedule)
    if x is None or not _meets_rows(problem, x):
        return None
    return costs.plain_step_energy_j * (1.0 + float(problem.cost @ x))


class _Result:
    """scipy's ``milp`` result, the fields :func:`interval_bound` reads (status 0 optimal, 1 stopped, 2 infeasible;
    ``fun``, what it reports at status 0, is here the dual bound: never above the incumbent, so a bound at any gap)."""

    def __init__(self, status: int, x: np.ndarray | None, fun: float | None, mip_dual_bound: float | None) -> None:
        self.status, self.x, self.fun, self.mip_dual_bound = status, x, fun, mip_dual_bound


def highs_model(problem: _Problem, integral: bool, time_limit_s: float, mip_gap: float):
    """``problem`` with its runtime row as a ``highspy.Highs`` model, silent, one thread, seed 0 (as scipy's ``milp``
    runs it): :func:`solve_highspy`'s, and the LP whose row duals price a split relaxation
    (:mod:`poetlab.planners.poet.lagrange`)."""
    import highspy

    n = problem.cost.size
    A = problem.A
    lower, upper = problem.row_lower, problem.row_upper
    if problem.runtime is not None:
        A = sp.vstack([A, sp.csr_matrix(problem.runtime[None, :])])
        lower, upper = np.append(lower, -np.inf), np.append(upper, problem.slack_s)
    A = sp.csc_matrix(A)
    h = highspy.Highs()
    for name, value in (("output_flag", False), ("threads", 1), ("time_limit", max(0.1, float(time_limit_s))), ("mip_rel_gap", float(mip_gap)), ("random_seed", 0)):
        h.setOptionValue(name, value)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, A.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = problem.cost, np.zeros(n), problem.upper
    lp.row_lower_ = np.where(np.isfinite(lower), lower, -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(upper), upper, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if integral else highspy.HighsVarType.kContinuous] * n
    h.passModel(lp)
    return h


def solve_highspy(problem: _Problem, integral: bool, time_limit_s: float, mip_gap: float, x0: np.ndarray | None, target: float | None, floor: float | None = None) -> _Result:
    """The relaxation by highspy in this process (one thread, as scipy's ``milp`` runs it), from ``x0`` where given,
    stopped once the dual bound reaches ``target`` (the objective above one plain step) or once a solution is below
    ``floor`` (likewise). Logs when the root's bound first shows and when the target is reached (NOTE 13's timings)."""
    import time

    import highspy

    started = time.perf_counter()
    n = problem.cost.size
    h = highs_model(problem, integral, time_limit_s, mip_gap)
    if x0 is not None:
        h.setSolution(n, np.arange(n, dtype=np.int32), np.asarray(x0, dtype=np.float64))
    seen: dict[str, float] = {}

    def on_progress(event) -> None:
        bound = float(event.data_out.mip_dual_bound)
        if not np.isfinite(bound):
            return
        seen.setdefault("first bound", time.perf_counter() - started)
        if target is not None and bound >= target:
            seen.setdefault("target", time.perf_counter() - started)
            event.data_in.user_interrupt = True
        if floor is not None and float(event.data_out.mip_primal_bound) < floor:
            seen.setdefault("floor", time.perf_counter() - started)
            event.data_in.user_interrupt = True

    def on_improving(event) -> None:
        log.debug("interval relaxation: incumbent %.6f at %.1f s", 1 + float(event.data_out.objective_function_value), time.perf_counter() - started)

    h.cbMipInterrupt.subscribe(on_progress)
    h.cbMipImprovingSolution.subscribe(on_improving)
    h.run()
    info, status = h.getInfo(), h.getModelStatus()
    S = highspy.HighsModelStatus
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    bound = float(info.mip_dual_bound) if integral else (float(info.objective_function_value) if status == S.kOptimal else None)
    log.info(
        "interval relaxation (highspy%s): %s in %.1f s, first dual bound at %s, target %s%s, dual bound %s, incumbent %s",
        ", from a start" if x0 is not None else "", h.modelStatusToString(status), time.perf_counter() - started,
        f"{seen['first bound']:.1f} s" if "first bound" in seen else "-", f"reached at {seen['target']:.1f} s" if "target" in seen else "not reached",
        f", a solution below the floor (the caller's bound) at {seen['floor']:.1f} s" if "floor" in seen else "",
        f"{1 + bound:.6f}" if bound is not None and np.isfinite(bound) else "-", f"{1 + info.objective_function_value:.6f}" if has else "-",
    )
    code = 0 if status == S.kOptimal else 2 if status == S.kInfeasible else 1
    x = np.asarray(h.getSolution().col_value) if has else None
    bound = bound if bound is not None and np.isfinite(bound) else None
    return _Result(code, x, bound, bound)


def _meets_rows(problem: _Problem, x: np.ndarray, tolerance: float = 1e-6) -> bool:
    """Whether ``x`` meets every row of the relaxation, its runtime row and its columns' bounds (a lever not allowed)."""
    ax = problem.A @ x
    fits = bool(np.all(ax >= problem.row_lower - tolerance) and np.all(ax <= problem.row_upper + tolerance) and np.all(x <= problem.upper + tolerance))
    return fits and (problem.runtime is None or float(problem.runtime @ x) <= problem.slack_s * (1 + 1e-9) + tolerance)


def interval_schedule(graph: TrainingGraph, problem: _Problem, x: np.ndarray) -> Schedule | None:
    """A schedule that follows a solution of the relaxation: across each row stage t_a it keeps what the
    solution holds (and node t_a's inputs and output where read before the next row stage); between row
    stages it keeps what is read before the next one or held there; a tensor the solution pages is paged
    out in the stage after its computation and in at the end of the stage before it is needed; the rest is
    recomputed where needed (the fewest recomputations, :func:`poetlab.planners.heuristics.minimal_recompute`).
    None where that would recompute a pinned node."""
    from poetlab.planners.heuristics import minimal_recompute

    T = graph.n_nodes
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    stages = problem.stages
    m = len(stages)
    row_of = {t: a for a, t in enumerate(stages)}
    # for each stage s, the row index whose interval holds it (-1 before the first row stage)
    interval = np.full(T, -1)
    for a, t in enumerate(stages):
        interval[t + 1 :] = a
    held = [{j for j, col in problem.H[a].items() if x[col]} for a in range(m)]
    paged = [{j for j, col in problem.PG[a].items() if x[col]} for a in range(m)]
    recomputed = [{j for j, col in problem.RC[a].items() if x[col]} for a in range(m)]
    wanted_inputs = [{j for i in recomputed[a] for j in inputs[i]} for a in range(m)]
    S_RAM = np.zeros((T, T), dtype=bool)
    M_IN = np.zeros((T, T), dtype=bool)
    M_OUT = np.zeros((T, T), dtype=bool)
    S_SSD = np.zeros((T, T), dtype=bool)

    def read_in(j: int, first: int, last: int) -> bool:
        return any(first <= k <= last for k in graph.consumers[j])

    for s in range(T - 1):
        a = row_of.get(s, interval[s])
        end = stages[0] if a < 0 else (stages[a + 1] if a + 1 < m else T - 1)
        later_held = held[a + 1] if a + 1 < m else set()
        wanted = wanted_inputs[a] if a >= 0 else set()
        if s in row_of:  # what the solution holds across t_a, and node t_a's inputs and output where needed
            candidates = held[a] | paged[a] | set(inputs[s]) | {s}
        else:
            candidates = range(s + 1)
        for j in candidates:
            S_RAM[s + 1, j] = read_in(j, s + 1, end) or j in later_held or j in wanted
    for a in range(m):
        for j in paged[a]:
            # page in at the end of the stage before the interval's first stage that wants j and does not hold it
            first = next((s for s in range(stages[a] + 1, (stages[a + 1] if a + 1 < m else T - 1) + 1) if S_RAM[s, j] and not S_RAM[s - 1, j]), None)
            if first is None or first - 1 < j + 2:
                continue
            M_IN[first - 1, j] = True
    for j in np.flatnonzero(M_IN.any(axis=0)):
        if not S_RAM[j + 1, j]:
            M_IN[:, j] = False
            continue
        M_OUT[j + 1, j] = True
        S_SSD[j + 2 :, j] = True
    R = minimal_recompute(graph, S_RAM, M_IN)
    if (R & ~np.eye(T, dtype=bool))[:, graph.pinned].any():
        return None  # it would recompute a node that no schedule may recompute
    return Schedule.from_matrices(graph, R, S_RAM, S_SSD, M_IN, M_OUT)


def interval_start(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float) -> tuple[float, list[Schedule], float | None]:
    """The relaxation's bound (J) and schedules from it, within ``time_limit_s`` in all: a third of it at the
    exact budget with the idle-gap and kept-through rows (the bound, and a schedule that may not fit: the rows
    do not see RAM inside a stage while a recomputation runs), the rest without the kept-through rows, with
    the budget less a margin for that RAM (the largest tensor, then half of it, each tried only if the one
    before found no solution; a margin that leaves less than the smallest single-node footprint admits no
    schedule and is skipped, and where both are, at the budget itself): quick starts the caller replays,
    dropping those over the budgets. (Without the kept-through rows HiGHS finds more and cheaper solutions
    in the same time, NOTE 8; their schedules are replayed anyway.) The trivial bound and no schedules with
    compression; no schedules with ``charge_pagein`` (page-ins here land at the end of a stage) or without
    recomputation. Third: the least value (J) of the solutions HiGHS found at the budget itself, or None: the relaxation
    there without the kept-through and idle-gap rows (rows, and columns of cost 0, that only cut) has its optimum at or
    below it (NOTE 15: from the best start it can then prove nothing above it)."""
    import time

    if options.compression:
        return costs.plain_step_energy_j, [], None
    deadline = time.perf_counter() + time_limit_s
    fixed = (2 * graph.param_bytes if options.params_in_budget else 0) + graph.reserved_bytes
    largest = float(graph.output_bytes.max())
    room = options.ram_budget_bytes - fixed - min_footprint_bytes(graph)[0]
    margins = [margin for margin in (largest, largest / 2) if margin <= room] or [0.0]
    exact = interval_bound(graph, costs, options, time_limit_s=time_limit_s / 3, gap_rows=True)
    log.info("interval bound (with the idle-gap and kept-through rows): %.10g J (%.6f x one plain step, %s, %.1f s)", exact.bound_j, exact.bound_j / costs.plain_step_energy_j, "optimal" if exact.optimal else "stopped", exact.seconds)
    solutions = [exact.incumbent] if exact.incumbent is not None else []
    if options.charge_pagein or not options.remat:
        return exact.bound_j, [], min(solutions) * costs.plain_step_energy_j if solutions else None
    schedules = [exact.schedule] if exact.schedule is not None else []
    for margin in margins:
        left = deadline - time.perf_counter()
        if left <= 0.1 or (exact.optimal and exact.schedule is None):
            break
        found = interval_bound(graph, costs, replace(options, ram_budget_bytes=options.ram_budget_bytes - margin), time_limit_s=left, mip_gap=1e-4, kept_rows=False)
        solutions += [found.incumbent] if found.incumbent is not None and margin == 0 else []  # (a smaller budget moves the stages)
        if found.schedule is not None:
            log.info("interval relaxation (budget less %d bytes): a schedule from its solution, %.1f s", margin, found.seconds)
            schedules.append(found.schedule)
            break
    return exact.bound_j, schedules, min(solutions) * costs.plain_step_energy_j if solutions else None


def interval_problem(graph: TrainingGraph, costs: CostModel, options: MilpOptions, gap_rows: bool = True, kept_rows: bool = True) -> _Problem | None:
    """The relaxation as arrays, for another backend (:mod:`poetlab.planners.poet.cpsat`): binary columns, costs
    in plain steps above one, its rows and its runtime row apart; with the idle-gap rows unless ``gap_rows`` is
    False. None where nothing is over budget, or with compression (the trivial bound)."""
    problem = _build(graph, costs, options, kept_rows)
    return problem if problem is None or not gap_rows else with_gap_rows(graph, problem)

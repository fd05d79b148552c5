"""The primal phase: a schedule from the interval relaxation restricted to the eviction bound's recomputations
(NOTE 18 in docs/solve.md).

Near the eviction bound (NOTE 2), the cheapest schedules recompute what the bound's cover recomputes (cheap
outputs: ReLU, batch-norm, skip-add) and differ in which tensors they page, each tensor's page-out and page-in
priced by the byte. The interval relaxation (NOTE 5, with NOTE 7's idle-gap and NOTE 8's kept-through rows)
searches all of that at once, and its HiGHS solve spends its time on recomputations that the runtime budget's
slack cannot pay for anyway. Restricted so that a tensor the cover does not recompute is never recomputed
inside an idle gap (its ZR columns, NOTE 7, fixed at 0: held, or paged in, before the use that ends the gap),
it is a paging problem around the cover's recomputations, and HiGHS finds its cheap solutions in seconds:
on Fig. 4's resnet18/m4/0.2/1.000177x a schedule at 1.021909 plain steps in 3.6 s, where the whole relaxation
gave 1.0246 in 16 s and nothing within 0.1% of the bound in 300 s (NOTE 17).

It runs where the cover's recomputations take nearly all of the runtime budget's slack (:func:`cover_fills_slack`:
there no schedule recomputes much more, so the restriction loses little). It proves nothing (a restriction, not a relaxation): its solution, made into a schedule, is a start that the
caller replays within the budgets.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.planners.poet.intervals import solve_highspy, interval_problem, interval_schedule
from poetlab.planners.poet.milp import MilpOptions

log = logging.getLogger("poetlab.primal")


#: the least share of the runtime budget's slack that the cover's recomputations must take for the phase to run: with
#: less, schedules recompute more than the cover and the restriction loses them (resnet18_cifar/m4/0.2/1.2x, 10% of its
#: slack: 1.625 plain steps after 20 s against a bound of 1.0197; NOTE 18)
MIN_SLACK_USED = 0.9


def cover_fills_slack(costs: CostModel, options: MilpOptions, recompute: np.ndarray) -> bool:
    """Whether the cover's recomputations take at least ``MIN_SLACK_USED`` of the runtime budget's slack (the runtime
    a schedule may add to one plain step), so that the restriction to them loses little; False without a runtime
    budget, or where paging time counts against it (the cover's page-outs and page-ins would share the slack)."""
    if options.runtime_budget_factor is None or options.count_paging_time:
        return False
    slack_s = (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s
    return slack_s > 0 and float(costs.recompute_runtime_s[recompute].sum()) >= MIN_SLACK_USED * slack_s


@dataclass(frozen=True)
class PrimalResult:
    """The restricted relaxation's best solution made into a schedule (None if none; replay it), its value in
    plain steps (None if none), whether HiGHS stopped on the caller's floor, and the seconds it took."""

    schedule: Schedule | None
    value: float | None
    reached: bool
    seconds: float


def cover_restricted(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, recompute: np.ndarray, time_limit_s: float, floor_j: float | None = None,
    mip_gap: float = 1e-4, max_columns: int | None = None,
) -> PrimalResult:
    """The interval relaxation (idle-gap and kept-through rows) with the ZR columns of every tensor that
    ``recompute`` (the eviction cover's choice, per tensor) leaves out fixed at 0, solved by HiGHS for
    ``time_limit_s`` (its build included), stopped as soon as a solution is below ``floor_j`` (the caller's
    certificate) or its dual bound reaches it (then none is), its best solution made into a schedule. Nothing where the relaxation has no idle gaps, or more
    than ``max_columns`` columns (on resnet50 at 10% and at its smallest footprint, 83k: 30 s gave schedules 1.1%
    and 23% above the bound, NOTE 18)."""
    started = time.perf_counter()
    problem = interval_problem(graph, costs, options)
    if problem is None or not problem.gaps or (max_columns is not None and problem.cost.size > max_columns):
        if problem is not None and problem.gaps:
            log.info("primal phase: skipped, %d columns (more than %d)", problem.cost.size, max_columns)
        return PrimalResult(None, None, False, time.perf_counter() - started)
    upper = problem.upper.copy()
    first = problem.cost.size - 2 * len(problem.gaps)  # the ZR columns, in the order of the gaps
    tensors = np.array([j for j, _ in problem.gaps], dtype=np.int64)
    upper[first + np.flatnonzero(~recompute[tensors])] = 0.0
    restricted = replace(problem, upper=upper)
    floor = None if floor_j is None else floor_j / costs.plain_step_energy_j - 1.0
    left_s = time_limit_s - (time.perf_counter() - started)
    result = solve_highspy(restricted, True, left_s, mip_gap, None, floor, floor)  # (its bound at the floor: no solution of it certifies)
    seconds = time.perf_counter() - started
    if result.x is None:
        log.info("primal phase (the relaxation restricted to the cover's recomputations): no solution in %.1f s", seconds)
        return PrimalResult(None, None, False, seconds)
    x = np.asarray(result.x).round()
    value = 1.0 + float(problem.cost @ x)
    log.info("primal phase (the relaxation restricted to the cover's recomputations): %.6f plain steps in %.1f s", value, seconds)
    return PrimalResult(interval_schedule(graph, restricted, x > 0.5), value, floor is not None and value - 1.0 < floor, seconds)

"""Published memory-saving methods as planners on the kit's one schedule format and one simulator.

Each method is a function ``plan(graph, costs, budgets, options) -> Schedule`` in a module of its own, which
raises :class:`CannotMeetBudget` with a one-line reason when the method has no schedule for the budget.
:func:`run_baseline` replays every schedule with :func:`~poetlab.core.schedule.simulate` under the same
budgets as POET's, so a method never gets a looser accounting than the MILP: a schedule over the budget
is reported as such, with the reason, never as a result.
"""

from __future__ import annotations

import time
from types import MappingProxyType

from poetlab.planners.baselines import capuchin, chen, checkpoint_all, dtr, milp_variants, pofo, revolve
from poetlab.planners.baselines.base import BaselineResult, Budgets, CannotMeetBudget, Planner, PlanOptions
from poetlab.core.costs import CostModel
from poetlab.errors import UnknownNameError
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import InvalidScheduleError, simulate

BASELINES: MappingProxyType[str, Planner] = MappingProxyType(
    {
        "checkpoint_all": checkpoint_all.plan,
        "checkmate": milp_variants.plan_checkmate,
        "paging_only": milp_variants.plan_paging_only,
        "chen_sqrtn": chen.plan_sqrtn,
        "chen_sqrtn_linearized": chen.plan_sqrtn_linearized,
        "chen_greedy": chen.plan_greedy,
        "chen_greedy_linearized": chen.plan_greedy_linearized,
        "revolve": revolve.plan,
        "pofo": pofo.plan,
        "pofo_time": pofo.plan_time,
        "capuchin": capuchin.plan,
        "dtr": dtr.plan,
    }
)

__all__ = ["BASELINES", "BaselineResult", "Budgets", "CannotMeetBudget", "PlanOptions", "run_baseline"]


def run_baseline(
    method: str, graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()
) -> BaselineResult:
    """Plan with ``method`` and replay the schedule within ``budgets``. A budget the method cannot meet
    gives a result that says why in one line, not an exception; an unknown method name raises."""
    if method not in BASELINES:
        raise UnknownNameError("baseline", method, BASELINES)
    started = time.perf_counter()
    try:
        schedule = BASELINES[method](graph, costs, budgets, options)
    except CannotMeetBudget as exc:
        return BaselineResult(method, False, str(exc), plan_time_s=time.perf_counter() - started)
    try:
        sim = simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=budgets.runtime_s(costs))
    except InvalidScheduleError as exc:
        return BaselineResult(method, False, f"{method} does not fit: {exc.reason}", schedule, plan_time_s=time.perf_counter() - started)
    return BaselineResult(method, True, "fits the budgets", schedule, sim, plan_time_s=time.perf_counter() - started)

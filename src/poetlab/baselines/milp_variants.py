"""The POET MILP with one of its two levers removed.

- Checkmate (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
  MLSys 2020): rematerialization only, the MILP with paging off. Checkmate minimizes compute cost; with
  the flop cost model, compute energy is proportional to it, so the optima coincide.
- Paging only: the MILP with recomputation off, the "paging" arm of the POET paper's Fig. 4.

Both go through :func:`poetlab.solve` (certificate, greedy start, time limit) with a 60 s default limit.
"""

from __future__ import annotations

from poetlab.costs import CostModel
from poetlab.graph import TrainingGraph
from poetlab.poet_solver import solve
from poetlab.schedule import Schedule

from poetlab.baselines.base import Budgets, CannotMeetBudget

TIME_LIMIT_S = 60.0


def _plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, **flags: bool) -> Schedule:
    result = solve(graph, costs, budgets.ram_bytes, budgets.runtime_factor, time_limit_s=TIME_LIMIT_S, **flags)
    if result.schedule is None:
        raise CannotMeetBudget(result.message)
    return result.schedule


def plan_checkmate(graph: TrainingGraph, costs: CostModel, budgets: Budgets) -> Schedule:
    return _plan(graph, costs, budgets, paging=False)


def plan_paging_only(graph: TrainingGraph, costs: CostModel, budgets: Budgets) -> Schedule:
    return _plan(graph, costs, budgets, remat=False)

"""The POET MILP with one of its two levers removed.

- Checkmate (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
  MLSys 2020): rematerialization only, the MILP with paging off. Checkmate minimizes compute cost; with
  the flop cost model, compute energy is proportional to it, so the optima coincide.
- Paging only: the MILP with recomputation off, the "paging" arm of the POET paper's Fig. 4.

Both go through :func:`poetlab.solve` (certificate, greedy start, time limit), so they differ from POET
in the levers alone. :func:`solve_variant` keeps the solver's status and gap for tables that show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.solver import SolveResult, solve
from poetlab.core.schedule import Schedule

MILP_VARIANTS: MappingProxyType[str, MappingProxyType[str, bool]] = MappingProxyType(
    {
        "poet": MappingProxyType({}),
        "checkmate": MappingProxyType({"paging": False}),
        "paging_only": MappingProxyType({"remat": False}),
    }
)


def solve_variant(
    variant: str, graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions(),
    starts: Sequence[Schedule] = (),
) -> SolveResult:
    """Solve the MILP with the levers of ``variant`` (a key of :data:`MILP_VARIANTS`). Given ``starts``
    (schedules that fit the same budgets), POET starts from the best of them instead of solving the
    one-lever problems itself first (see :func:`poetlab.solve`)."""
    return solve(
        graph, costs, budgets.ram_bytes, budgets.runtime_factor,
        time_limit_s=options.time_limit_s, mip_gap=options.mip_gap, threads=options.threads, staged=not starts, starts=starts, **MILP_VARIANTS[variant],
    )


def _plan(variant: str, graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions) -> Schedule:
    result = solve_variant(variant, graph, costs, budgets, options)
    if result.schedule is None:
        raise CannotMeetBudget(f"{variant}: {result.message}")
    return result.schedule


def plan_checkmate(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _plan("checkmate", graph, costs, budgets, options)


def plan_paging_only(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _plan("paging_only", graph, costs, budgets, options)

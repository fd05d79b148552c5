"""The POET MILP with one of its two levers removed, and POET without Capuchin's start.

- Checkmate (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
  MLSys 2020): rematerialization only, the MILP with paging off. Checkmate minimizes compute cost; with
  the flop cost model, compute energy is proportional to it, so the optima coincide.
- Paging only: the MILP with recomputation off, the "paging" arm of the POET paper's Fig. 4.
- POET without Capuchin's start (``poet_no_capuchin``): POET's solve starts from Capuchin's schedule
  among others, so POET at or below Capuchin holds by construction; without that start the comparison
  can fail (the paper's Fig. 5).

All go through :func:`poetlab.solve` (certificate, greedy start, time limit), so they differ from POET
in the levers (or the one start) alone. :func:`solve_variant` keeps the solver's status and gap for tables that show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.solver import SolveResult, solve
from poetlab.core.schedule import Schedule

MILP_VARIANTS: MappingProxyType[str, MappingProxyType[str, object]] = MappingProxyType(
    {
        "poet": MappingProxyType({}),
        "checkmate": MappingProxyType({"paging": False}),
        "paging_only": MappingProxyType({"remat": False}),
        "poet_no_capuchin": MappingProxyType({"exclude_starts": ("capuchin",)}),
    }
)
#: the variants with both levers (POET), which start from the one-lever variants' schedules at the same budget
INTEGRATED: tuple[str, ...] = tuple(name for name, flags in MILP_VARIANTS.items() if flags.get("paging", True) and flags.get("remat", True))


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

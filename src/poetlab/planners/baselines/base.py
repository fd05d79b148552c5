"""What every baseline shares: its budgets, its options, its way of saying no, and its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poetlab.core.costs import CostModel
from poetlab.errors import PoetlabError
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult, simulate


@dataclass(frozen=True)
class Budgets:
    """RAM for activations, in bytes, and runtime as a factor of one plain step (None: unbounded)."""

    ram_bytes: float
    runtime_factor: float | None = None

    def runtime_s(self, costs: CostModel) -> float | None:
        return None if self.runtime_factor is None else self.runtime_factor * costs.plain_step_runtime_s


@dataclass(frozen=True)
class PlanOptions:
    """How hard a planner may try: the MILP-based methods' time limit, the relative gap at which a
    solve counts as optimal, and solver threads (the others ignore all three)."""

    time_limit_s: float = 60.0
    threads: int | None = None
    mip_gap: float = 1e-4


class CannotMeetBudget(PoetlabError):
    """A method has no schedule within the budgets; the message says why in one line."""


def within_budgets(method: str, schedule: Schedule, graph: TrainingGraph, costs: CostModel, budgets: Budgets) -> Schedule:
    """``schedule`` if the simulator replays it within ``budgets``; else :class:`CannotMeetBudget` with
    the simulator's reason, for planners that cannot tell by themselves whether they met the budget."""
    try:
        simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=budgets.runtime_s(costs))
    except InvalidScheduleError as exc:
        raise CannotMeetBudget(f"{method}: {exc.reason}") from None
    return schedule


@dataclass(frozen=True)
class BaselineResult:
    """One method's answer: a schedule replayed by the simulator, or a one-line reason why there is none.
    ``plan_time_s`` is the wall time of planning and replay together."""

    method: str
    feasible: bool
    reason: str
    schedule: Schedule | None = None
    simulation: SimulationResult | None = None
    plan_time_s: float = 0.0

    @property
    def energy_j(self) -> float | None:
        return self.simulation.energy_j if self.simulation else None


Planner = Callable[[TrainingGraph, CostModel, Budgets, PlanOptions], Schedule]

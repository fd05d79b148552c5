"""What every baseline shares: its budgets, its way of saying no, and its result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poetlab.costs import CostModel
from poetlab.errors import PoetlabError
from poetlab.graph import TrainingGraph
from poetlab.schedule import Schedule, SimulationResult


@dataclass(frozen=True)
class Budgets:
    """RAM for activations, in bytes, and runtime as a factor of one plain step (None: unbounded)."""

    ram_bytes: float
    runtime_factor: float | None = None

    def runtime_s(self, costs: CostModel) -> float | None:
        return None if self.runtime_factor is None else self.runtime_factor * costs.plain_step_runtime_s


class CannotMeetBudget(PoetlabError):
    """A method has no schedule within the budgets; the message says why in one line."""


@dataclass(frozen=True)
class BaselineResult:
    method: str
    feasible: bool
    reason: str
    schedule: Schedule | None = None
    simulation: SimulationResult | None = None

    @property
    def energy_j(self) -> float | None:
        return self.simulation.energy_j if self.simulation else None


Planner = Callable[[TrainingGraph, CostModel, Budgets], Schedule]

"""Checkpoint-all: compute every node once and keep each tensor until its last use.

No recomputation, no paging: the memory-hungry reference point of Checkmate (Jain et al., MLSys 2020)
and of the POET paper, whose energy is one plain training step's.
"""

from __future__ import annotations

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule, checkpoint_all_schedule

from poetlab.planners.baselines.base import Budgets, PlanOptions


def plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return checkpoint_all_schedule(graph)

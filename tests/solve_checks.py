"""Cases and checks shared by the solver's tests (the MILP, its backends, ``solve``)."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.poet.repair import Budgets
from poetlab.planners.poet.milp import MilpOptions


def setup(model="linear", platform="m0"):
    """(graph, costs, checkpoint-all's peak) of a paper model by name, or of a given graph."""
    graph = build_paper_graph(model) if isinstance(model, str) else model
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    return graph, costs, peak


def replays(result, graph, costs, **kwargs):
    """The schedule replays with the reported energy and within the budget."""
    sim = simulate(result.schedule, graph, costs, ram_budget_bytes=result.ram_budget_bytes, runtime_budget_s=result.runtime_budget_s, **kwargs)
    assert sim.energy_j == pytest.approx(result.energy_j, rel=1e-12)
    assert sim.peak_ram_bytes <= result.ram_budget_bytes
    if result.objective_j is not None:
        assert result.objective_j == pytest.approx(sim.energy_j, rel=1e-6)
    return sim


def grid_instance(model, platform, fraction, factor):
    """A case as issue 28's grid builds it: the RAM budget ``fraction`` of the way from the smallest
    footprint to checkpoint-all's peak, the runtime budget ``factor`` plain steps. ``model``: a paper
    model's name or a graph. Returns (graph, costs, MILP options, a replay within both budgets, budgets)."""
    graph = build_paper_graph(model) if isinstance(model, str) else model
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    budget = float(int(footprint + fraction * (peak - footprint)))
    runtime_s = factor * costs.plain_step_runtime_s

    def replay(schedule):
        return simulate(schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=runtime_s, fixed_bytes=graph.reserved_bytes)

    return graph, costs, MilpOptions(budget, factor), replay, Budgets(budget, runtime_s, graph.reserved_bytes)

"""Cases and checks shared by the solver's tests (the MILP, its backends, ``solve``)."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.schedule import checkpoint_all_schedule, simulate


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

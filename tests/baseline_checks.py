"""Cases and checks shared by the dynamic baselines' tests (Capuchin, DTR)."""

from __future__ import annotations

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate
from poetlab.core.graph import min_footprint_bytes
from poetlab.planners.baselines.base import Budgets

from small_graphs import mlp, residual


def setup(name: str, platform: str):
    graph = {"mlp": mlp, "residual": residual}.get(name, lambda: build_paper_graph(name))()
    costs = CostModel.from_flops(graph, load_platform(platform))
    reference = simulate(checkpoint_all_schedule(graph), graph, costs)
    return graph, costs, reference


def between_footprint_and_peak(graph, reference, fraction: float) -> int:
    footprint, _ = min_footprint_bytes(graph)
    return int(footprint + fraction * (reference.peak_ram_bytes - footprint))


def check_valid(schedule, graph, costs, budgets: Budgets):
    """The schedule replays under both budgets, its stages never go back and stay below n_nodes."""
    sim = simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=budgets.runtime_s(costs))
    stages = [op.stage for op in schedule.ops]
    assert stages == sorted(stages) and 0 <= stages[0] and stages[-1] < graph.n_nodes
    assert schedule.matrices().R.sum() == sim.n_computes
    assert sim.peak_ram_bytes <= budgets.ram_bytes
    return sim

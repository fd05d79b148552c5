"""The techniques frontier: POET, POET with compression and sparse update at the same budgets, as a table and
a figure."""

from __future__ import annotations

from poetlab import CostModel, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.techniques.transforms import saved_tensor_graph

from small_graphs import convnet


def test_frontier_table_and_figure(tmp_path):
    from poetlab.reproduction.plotting import save_figure
    from poetlab.techniques.frontier import frontier_figure, frontier_table

    graph = saved_tensor_graph(convnet(8, 8, 3))
    platform = load_platform("m4")
    densities = {i: 0.3 for i, node in enumerate(graph.nodes) if node.kind == "relu"}
    costs = CostModel.from_flops(graph, platform)
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    budgets = [footprint + f * (peak - footprint) for f in (0.3, 1.0)]
    table = frontier_table(graph, platform, densities, budgets, first_trained=3, time_limit_s=30, mip_gap=0.0)
    assert set(table.method) == {"poet", "poet+compression", "sparse update"} and table.feasible.all()
    energy = table.set_index(["method", "ram_budget_bytes"]).energy_j
    assert energy["poet+compression", budgets[0]] < energy["poet", budgets[0]]
    assert energy["poet+compression", budgets[1]] == energy["poet", budgets[1]]  # checkpoint-all fits
    assert energy["sparse update", budgets[0]] < energy["poet", budgets[0]]
    path = save_figure(frontier_figure(table), tmp_path / "frontier.png")
    assert path.stat().st_size > 0

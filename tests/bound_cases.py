"""The small instances on which the relaxations' bounds are checked against exact optima (shared by the
interval relaxation's and the idle-gap rows' tests): graphs, levers, the quick cases and a budget helper."""

from __future__ import annotations

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate

from small_graphs import convnet, relu_chain, residual


def setup(graph, platform):
    """The cost model on ``platform``, checkpoint-all's peak and the smallest footprint."""
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return costs, peak, footprint


GRAPHS = {"linear": lambda: build_paper_graph("linear"), "residual": residual, "convnet": convnet, "relu_chain": lambda: relu_chain(10)}
LEVERS = {"poet": {}, "remat-only": {"paging": False}, "paging-only": {"remat": False}, "fixes": {"count_paging_time": True, "charge_pagein": True}, "params": {"params_in_budget": True}}
QUICK = [("relu_chain", "m4", 0.05, "poet"), ("linear", "m4", 0.05, "poet"), ("residual", "m0", 0.2, "poet"), ("convnet", "m4", 0.2, "fixes"), ("linear", "m4", 0.2, "remat-only")]
#: every other (graph, platform, fraction, levers) of the grid, for the slow runs
OTHERS = [
    (model, platform, fraction, levers)
    for model, platform in (("linear", "m4"), ("residual", "m0"), ("convnet", "m4"), ("relu_chain", "m4"))
    for fraction in (0.05, 0.2, 0.5)
    for levers in LEVERS
    if (model, platform, fraction, levers) not in QUICK
]

"""The MILP's one-lever variants: Checkmate (recompute only) and paging only."""

from __future__ import annotations

import numpy as np

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate
from poetlab.planners.baselines import Budgets, run_baseline


def test_milp_variants_use_only_their_lever():
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("m0"))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    budgets = Budgets(int(0.6 * peak), 2.0)
    checkmate = run_baseline("checkmate", graph, costs, budgets)
    paging = run_baseline("paging_only", graph, costs, budgets)
    assert checkmate.feasible and paging.feasible
    assert checkmate.simulation.n_pageouts == 0 and checkmate.simulation.n_recomputes > 0
    assert paging.simulation.n_recomputes == 0 and paging.simulation.n_pageouts > 0
    assert np.isfinite(checkmate.energy_j) and np.isfinite(paging.energy_j)

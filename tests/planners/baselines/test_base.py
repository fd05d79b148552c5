"""What every baseline shares (poetlab.planners.baselines.base): a result within its budgets or one line
saying why, never better than the MILP's optimum."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate, solve
from poetlab.core.graph import min_footprint_bytes
from poetlab.errors import UnknownNameError
from poetlab.planners.baselines import BASELINES, Budgets, run_baseline

from small_graphs import mlp, residual


@pytest.mark.parametrize("graph_factory,platform", [(mlp, "m0"), (residual, "a72"), (lambda: build_paper_graph("linear"), "m0")])
def test_no_baseline_beats_the_milp_optimum(graph_factory, platform):
    graph = graph_factory()
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    for fraction in (1.0, 0.5):
        budgets = Budgets(int(footprint + fraction * (peak - footprint)), 3.0)
        optimum = solve(graph, costs, budgets.ram_bytes, budgets.runtime_factor, mip_gap=0)
        assert optimum.status == "optimal"
        feasible = 0
        for method in BASELINES:
            result = run_baseline(method, graph, costs, budgets)
            assert "\n" not in result.reason
            if result.feasible:
                feasible += 1
                assert result.energy_j >= optimum.energy_j * (1 - 1e-9), method
                assert result.simulation.peak_ram_bytes <= budgets.ram_bytes
            else:
                assert result.reason and result.simulation is None
        assert feasible >= 1
        if fraction == 1.0:  # at its own peak checkpoint-all fits, and is optimal (the lower bound)
            reference = run_baseline("checkpoint_all", graph, costs, budgets)
            assert reference.feasible and reference.energy_j == pytest.approx(optimum.energy_j, rel=1e-9)


def test_methods_say_why_they_cannot_meet_a_budget():
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, load_platform("m0"))
    budgets = Budgets(1000, 2.0)  # below the smallest single-node footprint
    for method in BASELINES:
        result = run_baseline(method, graph, costs, budgets)
        assert not result.feasible
        assert len(result.reason.splitlines()) == 1 and result.reason
    with pytest.raises(UnknownNameError, match="valid baselines"):
        run_baseline("bogus", graph, costs, budgets)

"""Checkpoint-all: every node computed once and kept until its last use; one plain step's energy and the
peak every other method is measured against; over that peak's budget it does not fit, and says so."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform, simulate
from poetlab.core.schedule import OpKind
from poetlab.planners.baselines import Budgets, run_baseline
from poetlab.planners.baselines.checkpoint_all import plan

from small_graphs import residual


@pytest.mark.parametrize("graph_factory,platform", [(residual, "a72"), (lambda: build_paper_graph("resnet18_cifar"), "m4")])
def test_every_node_once_no_paging_one_plain_step(graph_factory, platform):
    graph = graph_factory()
    costs = CostModel.from_flops(graph, load_platform(platform))
    schedule = plan(graph, costs, Budgets(1e12))
    assert {op.kind for op in schedule.ops} <= {OpKind.COMPUTE, OpKind.FREE}
    assert (schedule.matrices().R.sum(axis=0) == 1).all()
    sim = simulate(schedule, graph, costs)
    assert sim.n_recomputes == sim.n_pageouts == 0
    assert sim.energy_j == pytest.approx(costs.plain_step_energy_j, rel=1e-12)
    assert sim.runtime_s == pytest.approx(costs.plain_step_runtime_s, rel=1e-12)


def test_it_fits_at_its_own_peak_and_not_a_byte_below():
    graph = residual()
    costs = CostModel.from_flops(graph, load_platform("a72"))
    peak = simulate(plan(graph, costs, Budgets(1e12)), graph, costs).peak_ram_bytes
    assert run_baseline("checkpoint_all", graph, costs, Budgets(peak)).feasible
    below = run_baseline("checkpoint_all", graph, costs, Budgets(peak - 1))
    assert not below.feasible and below.reason.startswith("checkpoint_all does not fit: ") and "\n" not in below.reason

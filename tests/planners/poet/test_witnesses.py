"""Schedules found offline that `solve` does not reach within its limit, kept as witnesses of what docs/solve.md
says of a row's optimum: replayed by the simulator within the row's budgets, each is within 0.1% of the bound
`solve` proves there, so that row's optimum lies between the two. They are never a start of the pipeline's
solves (every pipeline number comes out of its own solves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.schedule import Schedule, simulate
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.poet.bounds import eviction_bound
from poetlab.planners.poet.milp import MilpOptions

WITNESSES = Path(__file__).parent / "witnesses"


@pytest.mark.parametrize("factor", [2.0, 1.05])
def test_bert_on_the_m4_at_half_the_budget_is_within_a_tenth_of_a_percent_of_the_eviction_bound(factor):
    """NOTE 19: Fig. 3's bert/m4/0.5 (2x) and the grid's (1.05x) share a budget and an eviction bound (1.013709 plain
    steps); windows cut along the skip-add chain found a schedule 0.093% above it in 14 minutes, so the eviction
    bound, loose by construction on this chain (NOTE 16), is loose by less than the certifying gap here."""
    graph = build_paper_graph("bert", 1)
    costs = CostModel.from_flops(graph, load_platform("m4"))
    ram = budget_ladder(graph, costs, [0.5])[0]
    schedule = Schedule.load(WITNESSES / "bert-m4-0.5.schedule.json", graph)
    replayed = simulate(schedule, graph, costs, ram_budget_bytes=ram, runtime_budget_s=factor * costs.plain_step_runtime_s, fixed_bytes=graph.reserved_bytes)
    bound = eviction_bound(graph, costs, MilpOptions(ram, factor))
    assert bound > 1.01 * costs.plain_step_energy_j  # the budget binds: the bound is not the trivial one
    assert bound <= replayed.energy_j <= bound / (1 - 1e-3)

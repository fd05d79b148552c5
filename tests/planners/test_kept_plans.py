"""Plans kept on disk (poetlab.planners.kept_plans): planned once, read back on the next run, refused for
another graph or budget."""

from __future__ import annotations

import pytest

import poetlab
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.errors import InvalidArgumentError
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.kept_plans import planned_schedule


def test_the_benchmarks_keep_a_cases_plan_and_run_it_again(tmp_path):
    """``--schedules``: the first run plans a case with the MILP and keeps the plan; the next runs load that
    very schedule (a time-limited solve may return another); a kept plan that no longer fits the budget
    stops the run with the file named; checkpoint-all is never kept."""

    from small_graphs import residual

    graph = residual()
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes + graph.reserved_bytes  # (as solve counts)
    (budget,) = budget_ladder(graph, costs, [0.5])
    solved, status, _ = planned_schedule(graph, costs, budget, "residual-0.5", "poet", 10.0, tmp_path)
    assert solved is not None and status != "loaded" and (tmp_path / "residual-0.5.json").exists()
    loaded, status, message = planned_schedule(graph, costs, budget, "residual-0.5", "poet", 10.0, tmp_path)
    assert status == "loaded" and loaded == solved and "residual-0.5.json" in message
    with pytest.raises(InvalidArgumentError, match="residual-0.5.json"):
        planned_schedule(graph, costs, 0.1 * full, "residual-0.5", "poet", 10.0, tmp_path)
    assert planned_schedule(graph, costs, full, "residual-1", "poet", 10.0, tmp_path)[1] == "checkpoint_all"
    assert not (tmp_path / "residual-1.json").exists()

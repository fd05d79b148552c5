"""The comparison table: budgets between the two shared ends, every method on the same simulator."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate
from poetlab.planners.baselines import PlanOptions
from poetlab.planners.comparison import METHODS, budget_ladder, compare_methods, comparison_metrics, comparison_table
from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.core.graph import min_footprint_bytes


@pytest.fixture(scope="module")
def linear_m0():
    graph = build_paper_graph("linear")
    return graph, CostModel.from_flops(graph, load_platform("m0"))


def test_budget_ladder_spans_footprint_to_checkpoint_all_peak(linear_m0):
    graph, costs = linear_m0
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    assert budget_ladder(graph, costs, [1.0, 0.5, 0.0]) == [peak, footprint + (peak - footprint) // 2, footprint]
    for bad in ([], [1.5], [-0.1]):
        with pytest.raises(InvalidArgumentError, match="fractions"):
            budget_ladder(graph, costs, bad)


def test_every_method_on_every_budget_and_none_beats_poet(linear_m0):
    graph, costs = linear_m0
    fractions = [1.0, 0.6, 0.3, 0.0]
    rows = compare_methods(graph, costs, fractions, 2.0, METHODS, PlanOptions(time_limit_s=30))
    assert len(rows) == len(fractions) * len(METHODS)
    for fraction in fractions:
        at_budget = {row.method: row for row in rows if row.budget_fraction == fraction}
        poet = at_budget["poet"]
        assert poet.feasible and poet.status == "optimal"
        for row in at_budget.values():
            assert "\n" not in row.reason and row.reason
            if row.feasible:
                assert row.peak_ram_bytes <= row.ram_budget_bytes
                assert row.energy_j >= poet.energy_j * (1 - 1e-4), row.method  # POET's MIP gap is 1e-4
                assert row.energy_overhead == pytest.approx(row.energy_j / costs.plain_step_energy_j - 1)
            else:
                assert row.energy_j is None and row.status in ("no schedule", "infeasible", "time_limit")
    assert [row.method for row in rows[: len(METHODS)]] == list(METHODS)  # rows in the order asked
    at_peak = [row for row in rows if row.budget_fraction == 1.0 and row.method == "checkpoint_all"]
    assert at_peak[0].feasible and at_peak[0].energy_overhead == pytest.approx(0, abs=1e-12)
    # the smallest footprint is too tight for checkpoint-all, and POET still trains there
    at_footprint = {row.method: row for row in rows if row.budget_fraction == 0.0}
    assert not at_footprint["checkpoint_all"].feasible and at_footprint["poet"].feasible


def test_table_and_metrics(linear_m0):
    table = comparison_table([("linear", "m0")], [1.0, 0.0], 2.0, methods=["poet", "checkpoint_all", "chen_sqrtn"], time_limit_s=30)
    assert list(table.method) == ["poet", "checkpoint_all", "chen_sqrtn"] * 2
    metrics = comparison_metrics(table)
    assert metrics["n_rows"] == 6
    assert metrics["linear/m0"]["poet"]["n_feasible"] == 2
    assert metrics["linear/m0"]["checkpoint_all"]["n_feasible"] == 1
    assert metrics["methods_below_poet"] == []
    # a method that beat POET would be listed: make POET's row look worse than checkpoint-all's
    rigged = table.copy()
    rigged.loc[(rigged.method == "poet") & (rigged.budget_fraction == 1.0), "energy_j"] *= 2
    assert [case["method"] for case in comparison_metrics(rigged)["methods_below_poet"]] == ["checkpoint_all", "chen_sqrtn"]


def test_unknown_names_fail_before_any_work():
    with pytest.raises(UnknownNameError, match="valid methods"):
        comparison_table([("linear", "m0")], [1.0], 2.0, methods=["poet", "bogus"])
    with pytest.raises(UnknownNameError):
        comparison_table([("linear", "nosuchplatform")], [1.0], 2.0)


def test_poet_starts_from_the_one_lever_schedules_and_is_never_above_them():
    """At a 1 s time limit on resnet18_cifar / m4, POET's own staged solves would get a quarter second
    each; started from the one-lever MILPs' schedules, it is never above either of them."""
    graph = build_paper_graph("resnet18_cifar")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    rows = compare_methods(graph, costs, [0.5], 2.0, ["poet", "checkmate", "paging_only"], PlanOptions(time_limit_s=1.0, threads=1))
    by_method = {row.method: row for row in rows}
    assert by_method["poet"].feasible
    for method in ("checkmate", "paging_only"):
        if by_method[method].feasible:
            assert by_method["poet"].energy_j <= by_method[method].energy_j * (1 + 1e-12)

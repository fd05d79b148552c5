"""The user-models stage: a model file of the examples planned by POET and executed beside plain PyTorch;
its metrics, figure and closing sentence."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pandas as pd

from poetlab.reproduction.config import stage_config
from poetlab.reproduction.user_models import user_model_figure, user_model_metrics, user_model_summary, user_model_tables

from repo_paths import REPO


def test_the_example_model_planned_and_executed_at_checkpoint_alls_budget(monkeypatch):
    monkeypatch.chdir(REPO)  # (the model files are named relative to the repository)
    config = dataclasses.replace(stage_config("user_models", "smoke", REPO / "params.yaml"), fractions=(1.0,), steps=2)
    frontier, checks = user_model_tables(config)
    assert len(frontier) == len(checks) == len(config.models) == 1
    (row,), (check,) = frontier.to_dict("records"), checks.to_dict("records")
    assert row["feasible"] and row["budget_fraction"] == 1.0 and row["energy_over_plain"] == 1.0
    assert check["identical"] and check["within_budget"] and check["steps"] == 2
    metrics = user_model_metrics(frontier, checks)
    assert metrics["n_models"] == 1 and metrics["all_identical_and_within_budget"]
    assert metrics[row["model"]]["moved_tensors"] == 0  # at checkpoint-all's peak nothing moves


def test_metrics_summary_and_figure_on_tidy_rows():
    frontier = pd.DataFrame([
        {"model": "a", "feasible": True, "ram_budget_bytes": 2e6, "energy_over_plain": 1.0},
        {"model": "a", "feasible": True, "ram_budget_bytes": 1e6, "energy_over_plain": 1.2},
    ])
    checks = pd.DataFrame([{"model": "a", "identical": True, "within_budget": True, "measured_peak_bytes": 900_000, "ram_budget_bytes": 1e6,
                            "n_recomputes": 3, "n_pageouts": 1}])
    metrics = user_model_metrics(frontier, checks)
    assert metrics["a"]["energy_over_plain_at_tightest"] == 1.2 and metrics["a"]["moved_tensors"] == 4 and metrics["a"]["n_feasible"] == 2
    assert metrics["all_identical_and_within_budget"]
    assert user_model_summary(metrics).startswith("- a: at its tightest feasible budget (1,000,000 B) POET costs 1.2000x a plain step")
    fig = user_model_figure(frontier)
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["a"]
    plt.close(fig)


def test_a_model_without_a_feasible_budget_is_said_so():
    frontier = pd.DataFrame([{"model": "b", "feasible": False, "ram_budget_bytes": 1e6, "energy_over_plain": None}])
    checks = pd.DataFrame([{"model": "b", "identical": None, "within_budget": None, "measured_peak_bytes": None, "ram_budget_bytes": None,
                            "n_recomputes": None, "n_pageouts": None}])
    metrics = user_model_metrics(frontier, checks)
    assert metrics["b"]["n_feasible"] == 0 and metrics["b"]["identical"] is None and not metrics["all_identical_and_within_budget"]
    assert user_model_summary(metrics) == "- b: no budget of the grid was feasible."

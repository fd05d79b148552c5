"""The Tiny Training stage: the measured peaks of full and sparse update, with and without in-place updates,
and the reductions its metrics take from them."""

from __future__ import annotations

import pandas as pd
import pytest

from poetlab.reproduction.tiny_training import tiny_training_metrics, tiny_training_table


def test_the_metrics_are_ratios_of_the_tables_peaks():
    row = lambda scheme, reordered, step, fwd, bwd, cost: {  # noqa: E731
        "model": "m", "batch_size": 1, "scheme": scheme, "reordered": reordered, "step_peak_bytes": step,
        "forward_peak_bytes": fwd, "backward_peak_bytes": bwd, "trainable_param_bytes": 1, "cost_function_bytes": cost}
    table = pd.DataFrame([row("full", False, 800, 600, 800, 400), row("full", True, 700, 600, 700, 400),
                          row("last-2", False, 200, 150, 200, 100), row("last-2", True, 160, 150, 100, 100)])
    m = tiny_training_metrics(table)
    assert m["sparse_scheme"] == "last-2" and m["full_step_peak_bytes"] == 800
    assert m["sparse_step_reduction"] == pytest.approx(4.0) and m["reordered_step_reduction"] == pytest.approx(5.0)
    assert m["sparse_backward_reduction"] == pytest.approx(4.0) and m["reordered_backward_reduction"] == pytest.approx(8.0)
    assert m["sparse_cost_reduction"] == pytest.approx(4.0)
    assert m["forward_bound_bytes"] == 150 and m["forward_bound_reduction"] == pytest.approx(800 / 150)


def test_sparse_update_measures_lower_than_full_update():
    table = tiny_training_table("mobilenetv2_torch", "last-2")
    assert list(zip(table.scheme, table.reordered)) == [("full", False), ("full", True), ("last-2", False), ("last-2", True)]
    by = table.set_index(["scheme", "reordered"])
    assert by.step_peak_bytes[("last-2", False)] < by.step_peak_bytes[("full", False)]
    assert by.trainable_param_bytes[("last-2", False)] < by.trainable_param_bytes[("full", False)]
    assert (table.forward_peak_bytes <= table.step_peak_bytes).all()
    m = tiny_training_metrics(table)
    assert m["sparse_step_reduction"] > 1 and m["sparse_backward_reduction"] > 1

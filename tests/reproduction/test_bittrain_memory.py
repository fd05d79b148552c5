"""The BitTrain stage: a small DigitsCNN trained for real, one step measured with and without BitTrain at each
checkpoint: sparsity from training, smaller saved activations, bit-identical gradients."""

from __future__ import annotations

from poetlab.reproduction.bittrain_memory import bittrain_metrics, bittrain_table


def test_a_trained_networks_step_with_bittrain_keeps_less_and_the_same_gradients():
    table = bittrain_table(width=4, depth=2, batch_size=16, checkpoints=(0, 5))
    assert list(table.steps) == [0, 5]
    assert table.gradients_equal.all()
    assert ((table.relu_sparsity > 0) & (table.relu_sparsity < 1)).all()
    assert (table.stored_bytes < table.saved_bytes).all()  # bitmaps of ReLU outputs about half zeros
    assert ((table.activation_reduction > 0) & (table.activation_reduction < 1)).all()
    expected = 1 - (table.param_bytes + table.step_peak_bittrain_bytes) / (table.param_bytes + table.step_peak_plain_bytes)
    assert (table.training_memory_reduction == expected).all()
    metrics = bittrain_metrics(table)
    assert metrics["steps"] == 5 and metrics["gradients_equal"] is True
    assert metrics["relu_sparsity"] == table.relu_sparsity.iloc[-1] and metrics["max_relu_sparsity"] == table.relu_sparsity.max()

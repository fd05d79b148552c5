"""Tiny Training's headline (Lin et al., NeurIPS 2022): sparse update cuts the peak memory of a training
step 7-9x against full update, and 20-21x with the engine's operator reordering (each weight updated,
and its gradient freed, as soon as the backward pass has produced it).

We measure one real float32 PyTorch training step of the paper's MobileNetV2 (width 0.35, 128x128,
batch 1) under full update and under a sparse scheme, each without and with reordering
(:func:`poetlab.techniques.sparse_update.inplace_sgd`), from the CPU allocator: the whole step's peak,
the forward pass's and the backward pass's, and the scheme's memory cost function (saved activations and
gradient buffers). The paper's numbers come from its int8 engine on a microcontroller with 256 KB of
SRAM; a float32 PyTorch step keeps kernel workspaces the engine does not have, which the forward peak
shows (see :func:`tiny_training_metrics`)."""

from __future__ import annotations

import pandas as pd

#: "sparse update ... reduces the peak memory by 7-9x" and "20-21x" with the Tiny Training Engine's reordering
PAPER_SPARSE_REDUCTION = (7.0, 9.0)
PAPER_REORDERED_REDUCTION = (20.0, 21.0)
#: "on-device training under 256 KB" of SRAM
PAPER_SRAM_BYTES = 256 * 1024


def tiny_training_table(model: str, sparse_scheme: str, batch_size: int = 1, seed: int = 0) -> pd.DataFrame:
    """One row per (scheme, reordering): full and ``sparse_scheme`` (the syntax of
    :func:`poetlab.techniques.sparse_update.parse_scheme`), each without and with in-place updates."""
    from poetlab.techniques.sparse_update import measure_scheme, parse_scheme
    from poetlab.torch.models import build_torch_model

    built = build_torch_model(model, batch_size, seed)
    rows = []
    for spec in ("full", sparse_scheme):
        for inplace in (False, True):
            m = measure_scheme(built.module, built.inputs, built.targets, parse_scheme(spec, built.module), inplace=inplace)
            rows.append({
                "model": model, "batch_size": batch_size, "scheme": spec, "reordered": inplace,
                "step_peak_bytes": m.step_peak_bytes, "forward_peak_bytes": m.forward_peak_bytes, "backward_peak_bytes": m.backward_peak_bytes,
                "trainable_param_bytes": m.trainable_param_bytes, "cost_function_bytes": m.cost.total_bytes,
            })
    return pd.DataFrame(rows)


def tiny_training_metrics(table: pd.DataFrame) -> dict[str, object]:
    """Full update without reordering over the sparse scheme without and with it, on the whole step's
    peak and on the backward pass's (what sparse update and reordering act on); ``forward_bound``: the
    sparse step's forward peak, below which no backward-side saving can take the whole step."""
    by = table.set_index(["scheme", "reordered"])
    full = by.loc[("full", False)]
    sparse_scheme = next(s for s in table.scheme if s != "full")
    sparse, reordered = by.loc[(sparse_scheme, False)], by.loc[(sparse_scheme, True)]
    return {
        "model": str(table.model.iloc[0]), "sparse_scheme": sparse_scheme,
        "full_step_peak_bytes": int(full.step_peak_bytes),
        "sparse_step_peak_bytes": int(sparse.step_peak_bytes), "reordered_step_peak_bytes": int(reordered.step_peak_bytes),
        "sparse_step_reduction": float(full.step_peak_bytes / sparse.step_peak_bytes),
        "reordered_step_reduction": float(full.step_peak_bytes / reordered.step_peak_bytes),
        "sparse_backward_reduction": float(full.backward_peak_bytes / sparse.backward_peak_bytes),
        "reordered_backward_reduction": float(full.backward_peak_bytes / reordered.backward_peak_bytes),
        "sparse_cost_reduction": float(full.cost_function_bytes / sparse.cost_function_bytes),
        "forward_bound_bytes": int(reordered.forward_peak_bytes),
        "forward_bound_reduction": float(full.step_peak_bytes / reordered.forward_peak_bytes),
    }

"""``poetlab technique``: BitTrain or Tiny Training's sparse update measured on a real PyTorch model."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict




def cmd_bittrain(args: argparse.Namespace) -> int:
    from poetlab.techniques.bittrain import measure_bittrain

    m = measure_bittrain(args.model, args.batch_size, args.relu_bias)
    if args.json:
        print(json.dumps({**asdict(m), "activation_reduction": m.activation_reduction, "training_memory_reduction": m.training_memory_reduction, "time_overhead": m.time_overhead}, indent=2))
        return 0
    print(
        f"BitTrain on {m.model} (batch {m.batch_size}, mean ReLU density {m.mean_relu_density:.3f}): saved activations "
        f"{m.saved_bytes:,} -> {m.stored_bytes:,} bytes ({m.activation_reduction:.1%} less; {m.n_compressed} compressed, {m.n_dense} dense); "
        f"parameters + step peak {m.param_bytes + m.peak_plain_bytes:,} -> {m.param_bytes + m.peak_bittrain_bytes:,} bytes "
        f"({m.training_memory_reduction:.1%} less); step time {m.plain_time_s:.3f} -> {m.bittrain_time_s:.3f} s ({m.time_overhead:+.0%}); "
        f"gradients {'identical' if m.gradients_equal else 'DIFFERENT'}"
    )
    return 0 if m.gradients_equal else 1


def cmd_sparse_update(args: argparse.Namespace) -> int:
    from poetlab.techniques.sparse_update import measure_scheme, parse_scheme
    from poetlab.torch.models import build_torch_model

    built = build_torch_model(args.model, args.batch_size, 0)
    scheme = parse_scheme(args.scheme, built.module)
    m = measure_scheme(built.module, built.inputs, built.targets, scheme, inplace=args.inplace)
    if args.json:
        print(json.dumps({**asdict(m), "cost": {**asdict(m.cost), "total_bytes": m.cost.total_bytes}}, indent=2))
        return 0
    print(
        f"{scheme.name}{' + in-place' if m.inplace else ''} on {args.model} (batch {args.batch_size}): step peak {m.step_peak_bytes:,} bytes "
        f"(forward {m.forward_peak_bytes:,}, backward {m.backward_peak_bytes:,}); trainable parameters {m.trainable_param_bytes:,} bytes; "
        f"cost function {m.cost.total_bytes:,} bytes ({m.cost.saved_activation_bytes:,} saved activations + {m.cost.gradient_bytes:,} gradients)"
    )
    return 0

"""``poetlab profile``: measure this machine (the host platform)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.core.platforms import HOST



def cmd_profile(args: argparse.Namespace) -> int:
    from poetlab.torch.host_profile import default_profile_path
    from poetlab.torch.profile import profile_host
    from poetlab.torch.models import TORCH_MODELS

    if args.platform != HOST:
        raise InvalidArgumentError(f"only the host platform can be profiled (got {args.platform!r}); the paper platforms are coefficient files")
    from poetlab.torch.user_models import is_user_model

    if args.model is not None and args.model not in TORCH_MODELS and not is_user_model(args.model):
        raise UnknownNameError("torch model", args.model, TORCH_MODELS)
    profile = profile_host(
        args.paging_dir, model=args.model, batch_size=args.batch_size, fuse=args.fuse, repeats=args.repeats,
        warmup=args.warmup, threads=args.threads, disk_repeats=args.disk_repeats, compute_power_w=args.compute_power_w,
        memory_power_w=args.memory_power_w, progress=sys.stderr.isatty(), clock=args.clock,
    )
    output = args.output or default_profile_path(args.model, args.fuse)
    profile.save(output)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=1))
        return 0
    d, m = profile.disk, profile.machine
    rows = [
        ("machine", f"{m.cpu_model}, {m.logical_cores} logical cores, torch {m.torch_version} with {m.torch_threads} threads"),
        ("matmul rate", f"{profile.flops_per_s:.4g} flop/s ({profile.clock} clock)"),
        ("page-out", f"{d.pageout_latency_s * 1e3:.4g} ms + bytes / {d.pageout_throughput_bytes_per_s / 1e6:.4g} MB/s (write + fsync)"),
        ("page-in", f"{d.pagein_latency_s * 1e3:.4g} ms + bytes / {d.pagein_throughput_bytes_per_s / 1e6:.4g} MB/s ({d.cache_bypass})"),
        ("energy", f"{profile.energy_source}: compute {profile.compute_power_w:.4g} W, paging {d.power_w:.4g} W"),
    ]
    if profile.model is not None:
        t = profile.model
        rows.append(("model", f"{t.name} (batch {t.batch_size}{', fused' if t.fused else ''}): {len(t.nodes)} nodes"))
        forward = f" (forward pass {t.forward_runtime_s * 1e3:.4g} ms)" if t.forward_runtime_s is not None else ""
        rows.append(("step time", f"measured {t.step_runtime_s * 1e3:.4g} ms{forward}; nodes summed {t.node_runtime_sum_s * 1e3:.4g} ms (ratio {t.node_runtime_sum_s / t.step_runtime_s:.3f})"))
        slowdowns = [n.rerun_s / n.runtime_s for n in t.nodes if n.rerun_s is not None and n.runtime_s > 0]
        if slowdowns:
            rows.append(("reruns", f"{statistics.median(slowdowns):.3g}x a node's time alone (median of {len(slowdowns)} forward nodes, each rerun in the backward pass)"))
    rows.append(("written to", str(output)))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0

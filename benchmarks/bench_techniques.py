"""BitTrain, Tiny Training and compression-in-the-MILP, measured; writes experiments/benchmarks/techniques.json.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_techniques.py [--quick] [--parts bittrain sparse accuracy milp] [--out FILE]

- bittrain: ResNet-18 (CIFAR) one training step with and without BitTrain, at batch 8 and 32, with the
  BatchNorm bias before each ReLU at 0, -0.55 and -1.0 (mean ReLU density about 0.5, 0.3, 0.16):
  saved-activation bytes, parameters + allocator peak of the step, step time, gradient equality.
- sparse: MobileNetV2 (width 0.35, 128x128, batch 1) one training step under full, bias-only, last-2 and
  the Tiny-Training-shaped sparse scheme, with and without in-place updates: allocator peaks (whole
  step, forward, backward), trainable parameter bytes, the scheme's memory cost function.
- accuracy: digits transfer (pretrain on 0-4, fine-tune on 5-9) under full, bias-only, last-1, sparse.
- milp: a small conv chain (optimal solves), and the VGG-16 (CIFAR) paper graph with backward inputs as autograd saves them, densities measured on
  the torch twin, on the Cortex-M4 and the A72: POET vs POET + compression at a few budgets, and the
  frontier with sparse update (layers before forward node 10 frozen); plus the release's graph on the
  M4, where keeping a ReLU output compressed is never better than recomputing it.
- milp-vgg-m4: the same VGG-16 graph on the M4 at looser budgets (run with --time-limit 60).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform as host
import time

import torch

from poetlab import CostModel, build_paper_graph, load_platform, simulate
from poetlab.core.files import write_json_atomic
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule
from poetlab.techniques.bittrain import measure_bittrain
from poetlab.techniques.compression import densities_for_graph, measure_densities
from poetlab.techniques.frontier import frontier_table
from poetlab.techniques.sparse_update import measure_scheme, parse_scheme
from poetlab.techniques.transfer import digits_transfer
from poetlab.techniques.transforms import saved_tensor_graph
from poetlab.torch.models import build_torch_model
from poetlab.core.paper_models import conv_chain_graph


def bench_bittrain(quick: bool) -> list[dict]:
    rows = []
    for batch in (8,) if quick else (8, 32):
        for bias in (0.0, -0.55, -1.0):
            m = measure_bittrain("resnet18_cifar_torch", batch, bias, repeats=3)
            rows.append({**dataclasses.asdict(m), "activation_reduction": m.activation_reduction, "training_memory_reduction": m.training_memory_reduction, "time_overhead": m.time_overhead})
            print(f"bittrain batch {batch} bias {bias}: density {m.mean_relu_density:.3f}, activations -{m.activation_reduction:.1%}, training memory -{m.training_memory_reduction:.1%}, time {m.time_overhead:+.0%}, equal {m.gradients_equal}")
    return rows


def bench_sparse() -> list[dict]:
    built = build_torch_model("mobilenetv2_torch", 1, 0)
    rows = []
    for spec, inplace in (("full", False), ("full", True), ("bias-only", False), ("last-2", False), ("sparse", False), ("sparse", True)):
        m = measure_scheme(built.module, built.inputs, built.targets, parse_scheme(spec, built.module), inplace=inplace)
        rows.append({**dataclasses.asdict(m), "cost_total_bytes": m.cost.total_bytes})
        print(f"sparse update {spec}{' + in-place' if inplace else ''}: step peak {m.step_peak_bytes:,}, backward peak {m.backward_peak_bytes:,}, trainable {m.trainable_param_bytes:,}, cost {m.cost.total_bytes:,}")
    return rows


def bench_accuracy(quick: bool) -> dict:
    module = build_torch_model("mobilenetv2_torch", 1, 0).module
    schemes = [parse_scheme(s, module) for s in ("full", "bias-only", "last-1", "sparse")]
    started = time.perf_counter()
    source, results = digits_transfer(tuple(schemes), side=32, pretrain_epochs=2 if quick else 3, finetune_epochs=2 if quick else 3)
    out = {"source_accuracy": source, "results": [dataclasses.asdict(r) for r in results], "side": 32, "wall_s": time.perf_counter() - started}
    print(f"digits: pretrained {source:.3f}; " + ", ".join(f"{r.scheme} {r.test_accuracy:.3f}" for r in results))
    return out


def bench_milp_vgg_m4(time_limit_s: float) -> list[dict]:
    """VGG-16 (CIFAR, saved tensors) on the M4 at looser budgets (0.75 and 0.9 of the way to checkpoint-all)."""
    built = build_torch_model("vgg16_cifar_torch", 1, 0)
    graph = saved_tensor_graph(build_paper_graph("vgg16_cifar"))
    platform = load_platform("m4")
    densities = densities_for_graph(graph, measure_densities(built.module, built.inputs))
    costs = CostModel.from_flops(graph, platform)
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    budgets = [int(footprint + f * (peak - footprint)) for f in (0.75, 0.9)]
    table = frontier_table(graph, platform, densities, budgets, 2.0, time_limit_s=time_limit_s)
    print(table[["method", "ram_budget_bytes", "status", "energy_j", "n_compresses", "n_recomputes", "n_pageouts", "mip_gap"]].to_string(), flush=True)
    return [{**row, "graph": "saved", "time_limit_s": time_limit_s, "plain_step_energy_j": costs.plain_step_energy_j} for row in table.to_dict("records")]


def bench_milp(quick: bool, time_limit_s: float) -> list[dict]:
    built = build_torch_model("vgg16_cifar_torch", 1, 0)
    measured = measure_densities(built.module, built.inputs)
    rows = []
    # a small conv chain (three 3x3 convs, 8 channels, 8x8) whose MILPs solve to optimality, ReLU density 0.3
    small = saved_tensor_graph(conv_chain_graph(8, 8, 3))
    m4 = load_platform("m4")
    small_costs = CostModel.from_flops(small, m4)
    peak = simulate(checkpoint_all_schedule(small), small, small_costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(small)
    budgets = [int(footprint + f * (peak - footprint)) for f in (0.3, 0.6, 1.0)]
    table = frontier_table(small, m4, {i: 0.3 for i, n in enumerate(small.nodes) if n.kind == "relu"}, budgets, 2.0, first_trained=3, time_limit_s=time_limit_s, mip_gap=0.0)
    rows += [{**row, "graph": "saved", "checkpoint_all_peak_bytes": peak, "footprint_bytes": footprint, "plain_step_energy_j": small_costs.plain_step_energy_j, "first_trained": 3} for row in table.to_dict("records")]
    print(table[["method", "ram_budget_bytes", "status", "energy_j", "n_compresses", "n_recomputes", "n_pageouts", "mip_gap"]].to_string(), flush=True)
    # (graph, platform, budget fractions between the footprint and checkpoint-all's peak, first trained node)
    cases = [("saved", "m4", (0.25, 0.5), 10), ("saved", "a72", (0.25,), None), ("release", "m4", (0.25,), None)]
    for graph_kind, platform_name, fractions, first_trained in cases[:1] if quick else cases:
        release = build_paper_graph("vgg16_cifar")
        graph = saved_tensor_graph(release) if graph_kind == "saved" else release
        platform = load_platform(platform_name)
        densities = densities_for_graph(graph, measured)
        costs = CostModel.from_flops(graph, platform)
        peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
        footprint, _ = min_footprint_bytes(graph)
        budgets = [int(footprint + f * (peak - footprint)) for f in fractions]
        table = frontier_table(graph, platform, densities, budgets, 2.0, first_trained=first_trained, time_limit_s=time_limit_s)
        for row in table.to_dict("records"):
            rows.append({**row, "graph": graph_kind, "checkpoint_all_peak_bytes": peak, "footprint_bytes": footprint, "plain_step_energy_j": costs.plain_step_energy_j, "first_trained": first_trained})
        print(table[["method", "ram_budget_bytes", "status", "energy_j", "n_compresses", "n_recomputes", "n_pageouts", "mip_gap"]].assign(graph=graph_kind, platform=platform_name).to_string(), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and budgets")
    parser.add_argument("--parts", nargs="+", default=["bittrain", "sparse", "accuracy", "milp", "milp-vgg-m4"], choices=["bittrain", "sparse", "accuracy", "milp", "milp-vgg-m4"])
    parser.add_argument("--time-limit", type=float, default=60.0, help="POET's time limit per solve (compression gets twice)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default="experiments/benchmarks/techniques.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out: dict[str, object] = {"host": host.platform(), "torch": torch.__version__, "torch_threads": args.threads, "quick": args.quick}
    try:
        import json
        from pathlib import Path

        out.update({k: v for k, v in json.loads(Path(args.out).read_text()).items() if k in ("bittrain", "sparse_update", "accuracy", "milp", "milp_vgg_m4")})
    except (OSError, ValueError):
        pass
    if "bittrain" in args.parts:
        out["bittrain"] = bench_bittrain(args.quick)
    if "sparse" in args.parts:
        out["sparse_update"] = bench_sparse()
    if "accuracy" in args.parts:
        out["accuracy"] = bench_accuracy(args.quick)
    if "milp" in args.parts:
        out["milp"] = bench_milp(args.quick, args.time_limit)
    if "milp-vgg-m4" in args.parts:
        out["milp_vgg_m4"] = bench_milp_vgg_m4(args.time_limit)
    write_json_atomic(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

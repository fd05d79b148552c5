"""POET vs POET + compression on a real traced model, certified and executed; writes experiments/benchmarks/compression.json.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_compression.py [--model vgg16_cifar_torch] [--batch 1]
        [--platform m4] [--fractions 0.1 0.12 0.15] [--time-limit 30] [--relu-bias B] [--out FILE]

The defaults are the certified setting of issue #8: fused VGG-16 CIFAR, batch 1, Cortex-M4 flop model
(paging is dear there), where POET without compression solves to optimality in about 10 s, so its bound
is its optimum, and at some budgets POET + compression's simulated energy is below that bound. (On fused
ResNet-18 the MILP is too big to prove tight bounds in minutes and recomputing its BatchNorm and identity
nodes is almost free, so no budget was certified there.)

For one model of :mod:`poetlab.torch.models`, traced fused (``poetlab.torch.trace(..., fuse=True)``):

- densities: :func:`poetlab.techniques.compression.graph_densities`, per traced forward node, on the
  model's seeded example batch (random initialisation; ``--relu-bias`` shifts the BatchNorm biases with
  :func:`~poetlab.techniques.bittrain.shift_relu_density` first, off by default);
- costs: ``--platform`` a paper platform (flop model; compress and decompress at the
  ``FLOP_PER_ELEMENT`` ESTIMATE) or ``host`` (the fused host profile's measured node times, compress and
  decompress timed here by :func:`~poetlab.techniques.compression.measure_bitmap_rates`);
- budgets: ``--fractions`` of the way from the smallest single-node footprint to checkpoint-all's peak,
  plus the workspace :func:`poetlab.solve` keeps free (:func:`poetlab.planners.comparison.budget_ladder`);
- per budget: POET (time limit ``--time-limit``) with its proven lower bound, and POET + compression
  (twice the limit); *certified* when POET + compression's simulated energy is below POET's proven
  lower bound, i.e. below every schedule without compression;
- the compression schedule executed on the real module (``poetlab.torch.execute``, deterministic algorithms,
  one thread): parameter gradients bit-equal to plain autograd, measured peak vs the simulator's.
"""

from __future__ import annotations

import argparse
import copy
import logging
import numbers
import platform as host
import time

import torch

from poetlab import CostModel, load_platform, simulate, solve
from poetlab.core.files import write_json_atomic
from poetlab.torch.execute import execute, memory_allowance_bytes
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule
from poetlab.techniques.bittrain import shift_relu_density
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.compression import compress_all_schedule, compress_idle
from poetlab.techniques.compression import compression_costs, graph_densities, measure_bitmap_rates
from poetlab.torch.models import build_torch_model
from poetlab.torch.trace import trace
from poetlab.torch.kernels import planned_kernels


def jsonable(value):
    """``value`` with numpy scalars turned into Python ones (``json`` refuses ``numpy.bool_`` and ints)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (str, numbers.Number)):
        return value
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def costs_for(graph, platform_name: str, densities, margin: float):
    """(cost model with compression, how compression was costed, measured rates or None)."""
    if platform_name != "host":
        platform = load_platform(platform_name)
        cc = compression_costs(graph, platform, densities, margin)
        return CostModel.from_flops(graph, platform).with_compression(cc), "flop model, FLOP_PER_ELEMENT estimate", None
    from poetlab.torch.host_profile import HostProfile, find_host_profile

    profile = HostProfile.load(find_host_profile(graph.metadata.get("torch_model", graph.name), True))
    rates = measure_bitmap_rates(clock=profile.clock)
    cc = compression_costs(graph, profile.platform(), densities, margin, rates=rates)
    return CostModel.from_profile(graph, profile).with_compression(cc), "host profile; compress/decompress measured", rates


def executed(module, inputs, targets, loss_fn, graph, costs, schedule) -> dict:
    """Run ``schedule`` and a plain step from the same weights and the same RNG state (dropout draws the
    same masks in both); compare losses, gradients and peaks."""
    rng = torch.get_rng_state()
    reference = copy.deepcopy(module)
    plain_loss = loss_fn(reference(inputs), targets)
    plain_loss.backward()
    torch.set_rng_state(rng)
    scheduled = copy.deepcopy(module)
    result = execute(scheduled, schedule, (inputs, targets), graph=graph, loss_fn=loss_fn, costs=costs)
    equal = all(
        (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad))
        for a, b in zip(reference.parameters(), scheduled.parameters(), strict=True)
    )
    allowance = memory_allowance_bytes(module, graph)
    return {
        "losses_equal": bool(result.loss == float(plain_loss.detach())),
        "gradients_equal": bool(equal),
        "measured_peak_bytes": result.peak_bytes,
        "planned_peak_bytes": result.planned_peak_bytes,
        "predicted_peak_bytes": result.predicted.peak_ram_bytes,
        "allowance_bytes": allowance,
        "peak_within_allowance": bool(result.peak_bytes <= result.predicted.peak_ram_bytes + allowance),
        "executed_compresses": result.n_compresses,
        "executed_compressed_bytes": result.compressed_bytes,
        "executed_recomputes": result.n_recomputes,
        "executed_pageouts": result.n_pageouts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vgg16_cifar_torch")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--platform", default="m4")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.12, 0.15])
    parser.add_argument("--time-limit", type=float, default=30.0, help="POET's time limit per solve (compression gets twice)")
    parser.add_argument("--margin", type=float, default=0.1, help="density safety margin")
    parser.add_argument("--relu-bias", type=float, default=None, help="shift every BatchNorm bias (sparser ReLUs); default: as initialised")
    parser.add_argument("--out", default="experiments/benchmarks/compression.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    built = build_torch_model(args.model, args.batch, 0)
    if args.relu_bias is not None:
        shift_relu_density(built.module, args.relu_bias)
    module, inputs, targets, loss_fn = built.module, built.inputs, built.targets, built.loss_fn
    graph = trace(module, inputs, loss_fn, targets, fuse=True, name=args.model)
    graph = type(graph)(graph.name, graph.nodes, dict(graph.metadata, torch_model=args.model, batch_size=args.batch))
    densities = graph_densities(module, inputs, loss_fn, targets, graph)
    costs, costed, rates = costs_for(graph, args.platform, densities, args.margin)
    full = simulate(checkpoint_all_schedule(graph), graph, costs)
    footprint, _ = min_footprint_bytes(graph)
    bittrain = simulate(compress_all_schedule(graph, costs.compression), graph, costs)
    out: dict[str, object] = {
        "host": host.platform(), "torch": torch.__version__, "model": args.model, "batch_size": args.batch, "fused": True,
        "n_nodes": graph.n_nodes, "platform": args.platform, "compression_costed_by": costed, "margin": args.margin,
        "relu_bias": args.relu_bias, "time_limit_s": args.time_limit,
        "densities": {graph.nodes[i].name: d for i, d in densities.items()},
        "compressible": [graph.nodes[i].name for i in range(graph.n_nodes) if costs.compression.allowed[i]],
        "plain_step_energy_j": full.energy_j, "checkpoint_all_peak_bytes": full.peak_ram_bytes, "footprint_bytes": footprint,
        "compress_all_energy_j": bittrain.energy_j, "compress_all_peak_bytes": bittrain.peak_ram_bytes,
        "bitmap_rates": None if rates is None else {
            "densities": rates.densities, "compress_s_per_element": rates.compress_s_per_element,
            "decompress_s_per_element": rates.decompress_s_per_element, "numel": rates.numel, "threads": rates.threads, "clock": rates.clock,
        },
        "rows": [],
    }
    print(f"{args.model} batch {args.batch} fused: {graph.n_nodes} nodes, {int(costs.compression.allowed.sum())} compressible; plain {full.energy_j:.6g} J, "
          f"peak {full.peak_ram_bytes:,}, footprint {footprint:,}; compress-all {bittrain.energy_j:.6g} J at {bittrain.peak_ram_bytes:,}", flush=True)
    budgets = dict(zip(args.fractions, budget_ladder(graph, costs, args.fractions), strict=True))  # (the workspace solve keeps free added)
    poets = {}
    for fraction, budget in budgets.items():
        started = time.perf_counter()
        poets[fraction] = (solve(graph, costs, budget, time_limit_s=args.time_limit, threads=1), time.perf_counter() - started)
        print(f"POET at {budget:,} ({fraction:g}): {poets[fraction][0].status} {poets[fraction][0].energy_j} J, bound {poets[fraction][0].bound_j}", flush=True)
    # starts for the compression MILP: each POET schedule with its idle compressible outputs compressed
    # (less memory for the same computes), which may fit a tighter budget than the one it was solved at
    idle = [compress_idle(p.schedule, graph, costs.compression) for p, _ in poets.values() if p.schedule is not None]
    for fraction, budget in budgets.items():
        poet, poet_s = poets[fraction]
        started = time.perf_counter()
        both = solve(graph, costs, budget, compression=True, time_limit_s=2 * args.time_limit, threads=1, starts=idle + ([] if poet.schedule is None else [poet.schedule]))
        both_s = time.perf_counter() - started
        certified = bool(both.energy_j is not None and poet.bound_j is not None and both.energy_j < poet.bound_j * (1 - 1e-9))
        row = {
            "fraction": fraction, "ram_budget_bytes": budget,
            "poet": {**poet.to_dict(), "wall_s": poet_s}, "poet_compression": {**both.to_dict(), "wall_s": both_s},
            "poet_energy_j": poet.energy_j, "poet_bound_j": poet.bound_j, "compression_energy_j": both.energy_j,
            "strictly_below_poet": bool(both.energy_j is not None and poet.energy_j is not None and both.energy_j < poet.energy_j),
            "certified_below_poet_bound": certified,
            "margin_below_poet_bound_j": None if both.energy_j is None or poet.bound_j is None else poet.bound_j - both.energy_j,
        }
        if both.schedule is not None and both.n_compresses:
            row["execution"] = executed(module, inputs, targets, loss_fn, graph, costs, both.schedule)
        out["rows"].append(row)
        print(f"budget {budget:,} ({fraction:g}): POET {poet.status} {poet.energy_j} J (bound {poet.bound_j}); "
              f"+compression {both.status} {both.energy_j} J, {both.n_compresses} compresses; certified {certified}; "
              f"{row.get('execution')}", flush=True)
    write_json_atomic(args.out, jsonable(out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    with planned_kernels():  # (every step on the executor's kernels: NOTE [kernel choice] in poetlab.torch.kernels)
        main()

"""Host benchmark: the host profile of traced models, its disk beside the paper platforms, MILP solves.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_host.py [--repeats N] [--time-limit S] [--paging-dir DIR]

1. Profiles this machine with traced ``resnet18_cifar_torch`` (plain graph) and writes the profile to
   ``data/profiles/host-resnet18_cifar_torch.json``: per-node predicted runtime summed vs the measured
   time of one whole training step (their ratio), on the thread's CPU clock (the default with one thread)
   and, for comparison, on the wall clock. The fused graphs of the three solved models are
   profiled too (``data/profiles/host-<model>-fused.json``), so that their solves use measured costs.
2. Puts the measured disk latency and throughput beside the paper platforms' (src/poetlab/core/platform_specs/*.yaml).
3. Solves traced ``resnet18_cifar_torch``, ``mobilenetv2_torch`` and ``bert_small_torch`` on the host,
   plain and fused, at a RAM budget halfway between the smallest single-node footprint and
   checkpoint-all's peak (so remat or paging is needed), runtime budget 2x one plain step.

Results: experiments/benchmarks/host_profile.json and host_profile.md. Timings on a shared machine are
noisy: the ratio compares node and step times taken in the same run, seconds apart.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from poetlab import CostModel, available_platforms, load_platform
from poetlab.core.files import write_json_atomic, write_text_atomic
from poetlab.core.graph import min_footprint_bytes
from poetlab.planners.poet.solver import solve
from poetlab.torch.host_profile import HostProfile, default_profile_path
from poetlab.torch.profile import profile_host
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.trace import trace_torch_model

REPO = Path(__file__).resolve().parents[1]
SOLVED = ("resnet18_cifar_torch", "mobilenetv2_torch", "bert_small_torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--paging-dir", default=str(REPO))
    parser.add_argument("--out", default=str(REPO / "experiments" / "benchmarks" / "host_profile"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    profiles: dict[tuple[str, bool], HostProfile] = {}
    for model, fuse in [("resnet18_cifar_torch", False), *((m, True) for m in SOLVED)]:
        started = time.perf_counter()
        profile = profile_host(args.paging_dir, model=model, fuse=fuse, repeats=args.repeats, threads=args.threads)
        profile.save(default_profile_path(model, fuse))
        profiles[(model, fuse)] = profile
        t = profile.model
        print(f"profiled {model}{' fused' if fuse else ''} in {time.perf_counter() - started:.1f} s: nodes {t.node_runtime_sum_s * 1e3:.2f} ms, "
              f"step {t.step_runtime_s * 1e3:.2f} ms, ratio {t.node_runtime_sum_s / t.step_runtime_s:.3f}")

    # The same on the wall clock (not saved): on a shared machine it also counts waiting for a core.
    wall = profile_host(args.paging_dir, model="resnet18_cifar_torch", repeats=args.repeats, threads=args.threads, clock="wall")
    print(f"wall clock: nodes {wall.model.node_runtime_sum_s * 1e3:.2f} ms, step {wall.model.step_runtime_s * 1e3:.2f} ms")
    host = profiles[("resnet18_cifar_torch", False)]
    disks = [{"platform": "host (measured)", "pageout_latency_s": host.disk.pageout_latency_s,
              "pageout_throughput_bytes_per_s": host.disk.pageout_throughput_bytes_per_s,
              "pagein_latency_s": host.disk.pagein_latency_s, "pagein_throughput_bytes_per_s": host.disk.pagein_throughput_bytes_per_s,
              "memory_power_w": host.disk.power_w, "flops_per_s": host.flops_per_s}]
    for name in available_platforms():
        p = load_platform(name)
        disks.append({"platform": name, "pageout_latency_s": p.pageout_latency_s, "pageout_throughput_bytes_per_s": p.pageout_throughput_bytes_per_s,
                      "pagein_latency_s": p.pagein_latency_s, "pagein_throughput_bytes_per_s": p.pagein_throughput_bytes_per_s,
                      "memory_power_w": p.memory_power_w, "flops_per_s": p.flops_per_s})

    solves = []
    for model in SOLVED:
        for fuse in (False, True):
            started = time.perf_counter()
            graph = trace_torch_model(model, fuse=fuse)
            trace_s = time.perf_counter() - started
            measured = profiles.get((model, fuse))
            costs = CostModel.from_profile(graph, measured) if measured else CostModel.from_flops(graph, host.platform())
            footprint, _ = min_footprint_bytes(graph)
            peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
            budget = (footprint + peak) // 2
            result = solve(graph, costs, budget, 2.0, time_limit_s=args.time_limit, threads=args.threads)
            row = {
                "model": model, "fused": fuse, "n_nodes": graph.n_nodes, "n_forward": len(graph.forward_indices),
                "n_edges": graph.n_edges, "trace_s": trace_s, "costs": "measured" if measured else "flops at host rate",
                "min_footprint_bytes": footprint, "checkpoint_all_peak_bytes": peak, "ram_budget_bytes": budget,
                "runtime_budget_factor": 2.0, "time_limit_s": args.time_limit, "status": result.status, "solver": result.solver,
                "solve_time_s": result.solve_time_s, "mip_gap": result.mip_gap, "energy_j": result.energy_j,
                "plain_step_energy_j": costs.plain_step_energy_j, "peak_ram_bytes": result.peak_ram_bytes,
                "n_recomputes": result.n_recomputes, "n_pageouts": result.n_pageouts,
            }
            solves.append(row)
            print(f"{model}{' fused' if fuse else ''}: {graph.n_nodes} nodes, {result.status} in {result.solve_time_s:.1f} s, "
                  f"{result.n_recomputes} recomputes, {result.n_pageouts} page-outs, gap {result.mip_gap}")

    ratios = {f"{m}{'-fused' if f else ''}": p.model.node_runtime_sum_s / p.model.step_runtime_s for (m, f), p in profiles.items()}
    data = {"machine": host.to_dict()["machine"], "energy_source": host.energy_source, "notes": list(host.notes),
            "repeats": args.repeats, "threads": args.threads, "node_sum_over_step": ratios,
            "steps": {
                **{f"{m}{'-fused' if f else ''} ({p.clock} clock)": {"node_sum_s": p.model.node_runtime_sum_s, "step_s": p.model.step_runtime_s}
                   for (m, f), p in profiles.items()},
                "resnet18_cifar_torch (wall clock)": {"node_sum_s": wall.model.node_runtime_sum_s, "step_s": wall.model.step_runtime_s},
            },
            "load_average": [round(x, 2) for x in os.getloadavg()], "disk": disks, "cache_bypass": host.disk.cache_bypass, "solves": solves}
    write_json_atomic(f"{args.out}.json", data)
    write_text_atomic(f"{args.out}.md", _markdown(data))
    print(_markdown(data))
    print(f"load average at the end: {os.getloadavg()}")


def _markdown(data: dict) -> str:
    m = data["machine"]
    lines = [
        "# Host profile", "",
        f"{m['cpu_model']}, {m['logical_cores']} logical cores (shared), torch {m['torch_version']} with {data['threads']} thread(s), "
        f"{m['date']}; {data['repeats']} repeats per node (median); energies: {data['energy_source']}; "
        f"load average during the run {data['load_average']}. "
        "Written by `benchmarks/bench_host.py`.", "",
        "## Node times summed vs one whole training step (batch 1)", "",
        "| graph | nodes summed (ms) | whole step (ms) | ratio |", "|---|---|---|---|",
    ]
    for name, step in data["steps"].items():
        lines.append(f"| {name} | {step['node_sum_s'] * 1e3:.2f} | {step['step_s'] * 1e3:.2f} | {step['node_sum_s'] / step['step_s']:.3f} |")
    lines += ["", f"## Paging: host (page-in with {data['cache_bypass']}) beside the paper platforms", "",
              "| platform | page-out latency (ms) | page-out (MB/s) | page-in latency (ms) | page-in (MB/s) | paging power (W) | flop/s |",
              "|---|---|---|---|---|---|---|"]
    for d in data["disk"]:
        lines.append(f"| {d['platform']} | {d['pageout_latency_s'] * 1e3:.4g} | {d['pageout_throughput_bytes_per_s'] / 1e6:.4g} | "
                     f"{d['pagein_latency_s'] * 1e3:.4g} | {d['pagein_throughput_bytes_per_s'] / 1e6:.4g} | {d['memory_power_w']:.3g} | {d['flops_per_s']:.3g} |")
    lines += ["", "## POET MILP on traced models, host costs, budget halfway between the smallest footprint and checkpoint-all's peak, runtime 2x", "",
              "| model | fused | nodes | edges | costs | budget (B) | checkpoint-all peak (B) | status | solve (s) | gap | recomputes | page-outs | energy / plain step |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["solves"]:
        ratio = f"{r['energy_j'] / r['plain_step_energy_j']:.4f}" if r["energy_j"] else "-"
        gap = f"{r['mip_gap']:.2e}" if r["mip_gap"] is not None else "-"
        lines.append(f"| {r['model']} | {'yes' if r['fused'] else 'no'} | {r['n_nodes']} | {r['n_edges']} | {r['costs']} | {r['ram_budget_bytes']:,} | "
                     f"{r['checkpoint_all_peak_bytes']:,} | {r['status']} | {r['solve_time_s']:.1f} | {gap} | {r['n_recomputes']} | {r['n_pageouts']} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

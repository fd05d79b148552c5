"""MILP benchmark: the release's README instance and instances where remat or paging is needed.

    .venv/bin/python benchmarks/bench_milp.py [--time-limit S] [--threads N] [--out FILE]

Each instance is solved by ``poetlab.solve`` (HiGHS, the default backend here) and its schedule replayed
by the simulator; the row records solve time, status, gap, solver objective and simulated energy. The
budgets below checkpoint-all's peak are given as a fraction of that peak, so they force recomputation
or paging. Results go to experiments/benchmarks/milp.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform as host
import time

from tqdm.auto import tqdm

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.files import write_json_atomic
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.poet.solver import solve
from poetlab.planners.poet.backends import run_milp

# (label, model, platform, budget: bytes if > 1 else a fraction of checkpoint-all's peak, runtime factor)
INSTANCES = [
    ("readme", "resnet18_cifar", "a72", 3_000_000, 7.6),
    ("linear-tight", "linear", "m0", 0.5, 2.0),
    ("vgg16_cifar-tight", "vgg16_cifar", "a72", 0.6, 2.0),
    ("resnet18_cifar-tight", "resnet18_cifar", "a72", 0.6, 2.0),
    ("transformer-tight", "transformer", "m4", 0.9, 2.0),  # its QK^T tensor alone is 83% of checkpoint-all's peak
]


def run(time_limit_s: float, threads: int | None) -> list[dict[str, object]]:
    rows = []
    for label, model, platform_name, budget, factor in tqdm(INSTANCES, desc="MILP benchmark"):
        graph = build_paper_graph(model)
        costs = CostModel.from_flops(graph, load_platform(platform_name))
        peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
        ram = float(budget) if budget > 1 else float(int(budget * peak))
        started = time.perf_counter()
        result = solve(graph, costs, ram, factor, time_limit_s=time_limit_s, threads=threads)
        wall = time.perf_counter() - started
        rows.append(
            {
                "instance": label, "model": model, "platform": platform_name, "n_nodes": graph.n_nodes,
                "ram_budget_bytes": ram, "checkpoint_all_peak_bytes": peak, "runtime_budget_factor": factor,
                "status": result.status, "solver": result.solver, "solve_time_s": result.solve_time_s, "wall_s": wall,
                "mip_gap": result.mip_gap, "objective_j": result.objective_j, "energy_j": result.energy_j,
                "bound_j": result.bound_j, "peak_ram_bytes": result.peak_ram_bytes,
                "n_recomputes": result.n_recomputes, "n_pageouts": result.n_pageouts, "time_limit_s": time_limit_s,
            }
        )
        tqdm.write(f"{label}: {result.status} via {result.solver} in {wall:.1f} s, energy {result.energy_j}, gap {result.mip_gap}")
    rows.append(forced_milp_on_readme_instance(time_limit_s, threads))
    return rows


def forced_milp_on_readme_instance(time_limit_s: float, threads: int | None) -> dict[str, object]:
    """The README instance through the MILP itself, skipping the lower-bound certificate, started from
    checkpoint-all (which is optimal there): how long the solver needs to prove what the bound proves."""
    graph = build_paper_graph("resnet18_cifar")
    costs = CostModel.from_flops(graph, load_platform("a72"))
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=3_000_000, runtime_budget_factor=7.6))
    start = model.encode(checkpoint_all_schedule(graph).matrices().as_dict())
    answer = run_milp(model, solver="highs", time_limit_s=time_limit_s, threads=threads, start=start)
    tqdm.write(f"readme-forced-milp: {answer.status} in {answer.solve_time_s:.1f} s, objective {answer.objective}, gap {answer.gap}")
    return {
        "instance": "readme-forced-milp", "model": "resnet18_cifar", "platform": "a72", "n_nodes": graph.n_nodes,
        "ram_budget_bytes": 3_000_000, "runtime_budget_factor": 7.6, "status": answer.status, "solver": answer.solver,
        "solve_time_s": answer.solve_time_s, "mip_gap": answer.gap, "objective_j": answer.objective, "bound_j": answer.bound,
        "n_cols": model.n_cols, "n_rows": model.n_rows, "time_limit_s": time_limit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="experiments/benchmarks/milp.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rows = run(args.time_limit, args.threads)
    machine = {"cpu_count": os.cpu_count(), "machine": host.machine(), "python": host.python_version(), "processor": host.processor()}
    write_json_atomic(args.out, {"machine": machine, "time_limit_s": args.time_limit, "instances": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""MILP benchmark: POET's solve over the public grid of issue 28, the formulation before the eviction
bound side by side on a subset.

    .venv/bin/python benchmarks/bench_milp.py [--time-limit S] [--old N] [--only SUBSTRING] [--out FILE]

The grid: models vgg16_cifar, resnet18_cifar, resnet18, resnet50, bert, transformer; platforms m4 and
a72; RAM budgets 0.5 and 0.1 of the way from the smallest single-node footprint to checkpoint-all's
peak; runtime budgets 1.05x and 1.5x one plain step (48 instances). Each is solved by
``poetlab.solve`` at ``--mip-gap 1e-3`` with one thread, so a row that ends ``optimal`` gives its time
to 0.1%; a row that ends ``time_limit`` gives its final gap. Each row also has the root bound (the
eviction bound of :mod:`poetlab.bounds`, proven before any MILP) over the trivial bound (one plain
step), and the time it took. The first ``--old`` instances in a fixed spread of the grid are solved
again with ``bound="trivial"`` (the solver as it was before the bound), in the same run. Rows are
written after each instance (an interrupted run keeps what it measured), with ``uptime``'s load.
Results go to experiments/benchmarks/milp.json; docs/solve.md reads them.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform as host
import time

from tqdm.auto import tqdm

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab._io import write_json_atomic
from poetlab.bounds import eviction_bound
from poetlab.milp import MilpOptions
from poetlab.poet_solver import min_footprint_bytes, solve
from poetlab.schedule import checkpoint_all_schedule, simulate

MODELS = ("vgg16_cifar", "resnet18_cifar", "resnet18", "resnet50", "bert", "transformer")
PLATFORMS = ("m4", "a72")
FRACTIONS = (0.5, 0.1)
FACTORS = (1.05, 1.5)
GRID = list(itertools.product(MODELS, PLATFORMS, FRACTIONS, FACTORS))
OLD_SIDE_BY_SIDE = GRID[::6]  # 8 instances spread over models, platforms, budgets and runtimes
MIP_GAP = 1e-3


def load() -> float:
    return os.getloadavg()[0]


def budget_of(graph, costs, fraction: float) -> float:
    """``fraction`` of the way from the smallest single-node footprint to checkpoint-all's peak."""
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return float(int(footprint + fraction * (peak - footprint)))


def row(model: str, platform_name: str, fraction: float, factor: float, time_limit_s: float, bound: str) -> dict[str, object]:
    graph = build_paper_graph(model)
    costs = CostModel.from_flops(graph, load_platform(platform_name))
    ram = budget_of(graph, costs, fraction)
    trivial = costs.plain_step_energy_j
    started = time.perf_counter()
    root = eviction_bound(graph, costs, MilpOptions(ram, factor)) if bound == "eviction" else trivial
    root_s = time.perf_counter() - started
    load_before = load()
    started = time.perf_counter()
    result = solve(graph, costs, ram, factor, time_limit_s=time_limit_s, threads=1, mip_gap=MIP_GAP, bound=bound)
    wall = time.perf_counter() - started
    return {
        "model": model, "platform": platform_name, "budget_fraction": fraction, "runtime_budget_factor": factor,
        "bound": bound, "n_nodes": graph.n_nodes, "ram_budget_bytes": ram, "status": result.status, "solver": result.solver,
        "root_bound_ratio": root / trivial, "root_bound_s": root_s, "energy_ratio": (result.energy_j or float("nan")) / trivial,
        "bound_ratio": (result.bound_j or float("nan")) / trivial, "final_gap": result.mip_gap, "wall_s": wall,
        "time_to_0.1%_s": wall if result.status == "optimal" else None, "load_1min_before": load_before, "load_1min_after": load(),
        "energy_j": result.energy_j, "bound_j": result.bound_j, "trivial_bound_j": trivial, "time_limit_s": time_limit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--old", type=int, default=len(OLD_SIDE_BY_SIDE), help="how many instances to solve the old way too (default 8)")
    parser.add_argument("--only", default="", help="run only the instances whose label contains this")
    parser.add_argument("--out", default="experiments/benchmarks/milp.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    machine = {"cpu_count": os.cpu_count(), "machine": host.machine(), "python": host.python_version(), "processor": host.processor()}
    jobs = [(spec, "eviction") for spec in GRID] + [(spec, "trivial") for spec in OLD_SIDE_BY_SIDE[: args.old]]
    jobs = [(spec, bound) for spec, bound in jobs if args.only in "/".join(map(str, spec))]
    rows = []
    for spec, bound in tqdm(jobs, desc="MILP benchmark"):
        rows.append(row(*spec, args.time_limit, bound))
        r = rows[-1]
        tqdm.write(
            f"{'/'.join(map(str, spec))} [{bound}]: {r['status']} in {r['wall_s']:.1f} s, root {r['root_bound_ratio']:.6f}, "
            f"energy {r['energy_ratio']:.6f}, gap {r['final_gap']}, load {r['load_1min_before']:.1f}"
        )
        write_json_atomic(args.out, {"machine": machine, "time_limit_s": args.time_limit, "mip_gap": MIP_GAP, "threads": 1, "instances": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

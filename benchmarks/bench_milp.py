"""MILP benchmark: POET's solve over the public grid of issue 28, the formulation before the eviction
bound side by side on a subset.

    git archive d677458 src | tar -x -C /tmp/poetlab-old      # the solver before issue 28, for --old-src
    .venv/bin/python benchmarks/bench_milp.py [--time-limit S] [--old-src /tmp/poetlab-old/src] [--only LABEL,LABEL] [--merge] [--out FILE]

The grid: models vgg16_cifar, resnet18_cifar, resnet18, resnet50, bert, transformer; platforms m4 and
a72; RAM budgets 0.5 and 0.1 of the way from the smallest single-node footprint to checkpoint-all's
peak; runtime budgets 1.05x and 1.5x one plain step (48 instances). Each is solved by
``poetlab.solve`` at ``--mip-gap 1e-3`` with one thread, so a row that ends ``optimal`` gives its time
to 0.1%; a row that ends ``time_limit`` gives its final gap. Each row also has the root bound (the
eviction bound of :mod:`poetlab.planners.poet.bounds`, proven before any MILP) over the trivial bound (one plain
step), and the time it took. With ``--old-src``, 8 instances in a fixed spread of the grid are solved
again in the same run by the code before issue 28 (commit d677458, its ``solve`` in a subprocess with
that tree first on ``PYTHONPATH``: its formulation, its trivial bound, its worker), same options. Rows are
written after each instance (an interrupted run keeps what it measured), with ``uptime``'s load.
Results go to experiments/benchmarks/milp.json; ``bench_milp.py --markdown FILE`` prints docs/solve.md's table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform as host
import subprocess
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.files import write_json_atomic
from poetlab.planners.poet.bounds import eviction_bound
from poetlab.planners.poet.milp import MilpOptions
from poetlab.core.graph import min_footprint_bytes
from poetlab.planners.poet.solver import solve
from poetlab.core.schedule import checkpoint_all_schedule, simulate

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


OLD_RUN = """
import json, sys, time
from poetlab import CostModel, build_paper_graph, load_platform, solve
model, platform_name, ram, factor, limit = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
graph = build_paper_graph(model)
costs = CostModel.from_flops(graph, load_platform(platform_name))
started = time.perf_counter()
r = solve(graph, costs, ram, factor, time_limit_s=limit, threads=1, mip_gap=float(sys.argv[6]))
print(json.dumps({"status": r.status, "solver": r.solver, "wall_s": time.perf_counter() - started, "energy_j": r.energy_j, "bound_j": r.bound_j, "final_gap": r.mip_gap}))
"""


def old_row(model: str, platform_name: str, fraction: float, factor: float, time_limit_s: float, old_src: str) -> dict[str, object]:
    """The same instance solved by the code before issue 28 (a subprocess on ``old_src``)."""
    graph = build_paper_graph(model)
    costs = CostModel.from_flops(graph, load_platform(platform_name))
    ram = budget_of(graph, costs, fraction)
    load_before = load()
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", OLD_RUN, model, platform_name, repr(ram), repr(factor), repr(time_limit_s), repr(MIP_GAP)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": old_src, "POETLAB_PLATFORM_DIR": str(Path("src/poetlab/core/platform_specs").resolve())}, check=True,
    )
    wall = time.perf_counter() - started  # with the interpreter's start and its imports (torch, in that code)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    trivial = costs.plain_step_energy_j
    return {
        "model": model, "platform": platform_name, "budget_fraction": fraction, "runtime_budget_factor": factor, "bound": "before issue 28",
        "n_nodes": graph.n_nodes, "ram_budget_bytes": ram, "status": answer["status"], "solver": answer["solver"],
        "root_bound_ratio": 1.0, "energy_ratio": (answer["energy_j"] or float("nan")) / trivial, "bound_ratio": (answer["bound_j"] or float("nan")) / trivial,
        "final_gap": answer["final_gap"], "wall_s": answer["wall_s"], "process_wall_s": wall,
        "time_to_0.1%_s": answer["wall_s"] if answer["status"] == "optimal" else None, "load_1min_before": load_before, "load_1min_after": load(),
        "energy_j": answer["energy_j"], "bound_j": answer["bound_j"], "trivial_bound_j": trivial, "time_limit_s": time_limit_s,
    }


def markdown(path: str) -> str:
    """The table of docs/solve.md from a results file: one line per instance, the old rows beside."""
    import math
    import statistics

    data = json.loads(Path(path).read_text())
    rows = data["instances"]
    old = {(r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"]): r for r in rows if r["bound"] != "eviction"}
    out = [
        "| model | platform | budget | runtime | root bound / trivial | status | time to 0.1% (s) | final gap | energy / trivial | limit (s) | load | before issue 28: status, time (s), gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(value, fmt):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    new_rows = [r for r in rows if r["bound"] == "eviction"]
    for r in new_rows:
        key = (r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"])
        before = old.get(key)
        was = f"{before['status']}, {before['wall_s']:.1f}, {cell(before['final_gap'], '.3%')}" if before else ""
        out.append(
            f"| {r['model']} | {r['platform']} | {r['budget_fraction']} | {r['runtime_budget_factor']} | {r['root_bound_ratio']:.6f} | {r['status']} | "
            f"{cell(r['time_to_0.1%_s'], '.1f')} | {cell(r['final_gap'], '.3%')} | {cell(r['energy_ratio'], '.6f')} | {r['time_limit_s']:g} | {r['load_1min_before']:.1f} | {was} |"
        )
    certified = [r for r in new_rows if r["status"] == "optimal"]
    above = [r for r in new_rows if r["root_bound_ratio"] > 1 + 1e-9]
    paired = [(r, old[k]) for r in new_rows if (k := (r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"])) in old]
    censored = lambda r: r["time_to_0.1%_s"] if r["time_to_0.1%_s"] is not None else math.inf  # noqa: E731
    out.append("")
    limits = " or ".join(f"{x:g}" for x in sorted({r["time_limit_s"] for r in new_rows}))
    out.append(f"{len(certified)} of {len(new_rows)} instances certified within 0.1% within their row's limit ({limits} s); root bound above the trivial one on {len(above)} of {len(new_rows)}.")
    if paired:
        new_median = statistics.median(censored(r) for r, _ in paired)
        old_median = statistics.median(censored(o) for _, o in paired)
        old_limit = max(o["time_limit_s"] for _, o in paired)
        out.append(f"On the {len(paired)} side-by-side instances, median time to 0.1%: {new_median:.2f} s now, {old_median if math.isfinite(old_median) else f'over {old_limit:g}'} s before (a row not certified counts as infinite).")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":
        print(markdown(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--old-src", default=None, help="a src/ tree of the code before issue 28 (see the docstring); its 8 rows are skipped without it")
    parser.add_argument("--only", default="", help="run only the instances whose label (model/platform/fraction/factor) contains one of these comma-separated strings")
    parser.add_argument("--merge", action="store_true", help="replace the rows of the instances run in --out, keeping its other rows (a targeted re-run)")
    parser.add_argument("--out", default="experiments/benchmarks/milp.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    machine = {"cpu_count": os.cpu_count(), "machine": host.machine(), "python": host.python_version(), "processor": host.processor()}
    # each old row right after the new row of the same instance, so both see about the same load
    jobs = [(spec, kind) for spec in GRID for kind in ("new", "old") if kind == "new" or (args.old_src and spec in OLD_SIDE_BY_SIDE)]
    wanted = args.only.split(",")
    jobs = [(spec, kind) for spec, kind in jobs if any(part in "/".join(map(str, spec)) for part in wanted)]
    rows = []
    earlier = json.loads(Path(args.out).read_text())["instances"] if args.merge and Path(args.out).exists() else []
    key = lambda r: ((r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"]), r["bound"])  # noqa: E731
    for spec, kind in tqdm(jobs, desc="MILP benchmark"):
        rows.append(row(*spec, args.time_limit, "eviction") if kind == "new" else old_row(*spec, args.time_limit, args.old_src))
        bound = rows[-1]["bound"]
        r = rows[-1]
        tqdm.write(
            f"{'/'.join(map(str, spec))} [{bound}]: {r['status']} in {r['wall_s']:.1f} s, root {r['root_bound_ratio']:.6f}, "
            f"energy {r['energy_ratio']:.6f}, gap {r['final_gap']}, load {r['load_1min_before']:.1f}"
        )
        done = {key(r) for r in rows}  # an earlier row stays until this run has measured its instance again
        merged = sorted([r for r in earlier if key(r) not in done] + rows, key=lambda r: (GRID.index((r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"])), r["bound"] != "eviction"))
        write_json_atomic(args.out, {"machine": machine, "time_limit_s": max(r["time_limit_s"] for r in merged), "mip_gap": MIP_GAP, "threads": 1, "instances": merged})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

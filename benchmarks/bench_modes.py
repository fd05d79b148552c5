"""POET against its own restrictions on every paper model: remat + paging, remat only (Checkmate),
paging only, at one budget per model that checkpoint-all does not fit.

    .venv/bin/python benchmarks/bench_modes.py [--platform a72] [--time-limit S] [--models M ...] [--out FILE]

With ``--models``, only those models are run and their rows replace theirs in an existing ``--out``
file (each row records its own time limit), so one hard model can be re-run with a longer limit.

The budget is max(0.9 x checkpoint-all's peak, the footprint + half the way to that peak), the runtime
budget 2x one plain step. Where all three are certified within the gap, POET must not be worse; where
a solve stops at its time limit, its row says so and carries its gap. Writes
experiments/benchmarks/milp_modes.json.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from tqdm.auto import tqdm

from poetlab import PAPER_MODELS, CostModel, build_paper_graph, load_platform, simulate, solve
from poetlab.core.files import write_json_atomic
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule

MODES = {"poet": {}, "remat_only": {"paging": False}, "paging_only": {"remat": False}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="a72")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="+", choices=sorted(PAPER_MODELS), default=sorted(PAPER_MODELS))
    parser.add_argument("--out", default="experiments/benchmarks/milp_modes.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    platform = load_platform(args.platform)
    rows = []
    for model in tqdm(args.models, desc="models"):
        graph = build_paper_graph(model)
        costs = CostModel.from_flops(graph, platform)
        peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
        footprint, _ = min_footprint_bytes(graph)
        budget = int(max(0.9 * peak, footprint + 0.5 * (peak - footprint)))
        for mode, flags in MODES.items():
            result = solve(graph, costs, budget, 2.0, time_limit_s=args.time_limit, threads=args.threads, **flags)
            rows.append({
                "model": model, "platform": platform.name, "n_nodes": graph.n_nodes, "mode": mode, "time_limit_s": args.time_limit,
                "ram_budget_bytes": budget, "checkpoint_all_peak_bytes": peak, "status": result.status,
                "solver": result.solver, "energy_j": result.energy_j, "objective_j": result.objective_j,
                "bound_j": result.bound_j, "mip_gap": result.mip_gap, "solve_time_s": result.solve_time_s,
                "n_recomputes": result.n_recomputes, "n_pageouts": result.n_pageouts,
            })
            tqdm.write(f"{model} {mode}: {result.status} ({result.solver}, {result.solve_time_s:.1f} s) energy {result.energy_j} gap {result.mip_gap}")
    out = Path(args.out)
    if set(args.models) != set(PAPER_MODELS) and out.exists():
        kept = [row for row in json.loads(out.read_text())["runs"] if row["model"] not in args.models]
        rows = sorted(kept + rows, key=lambda row: (row["model"], list(MODES).index(row["mode"])))
    write_json_atomic(out, {"platform": platform.name, "runs": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The interval relaxation's bound against the eviction bound on the grid rows that miss (docs/solve.md, NOTE 5).

    PYTHONPATH=src python benchmarks/bench_interval_bound.py [--time-limit S] [--out FILE]

For each row, in the same run: the eviction bound (NOTE 2) and its time; the interval relaxation
solved by HiGHS within the limit at the exact budget: its proven bound (a stopped solve's dual bound), its
best solution's objective (the most it could prove with more time) and its time; the same with the
idle-gap rows (NOTE 7), solved right after it with the same limit; both LP relaxations and their times; the relaxation solved
with the budget less the largest tensor (what ``solve`` starts from) and its schedule's energy replayed
by the simulator within both budgets (or why not); and the best schedule the grid's last run recorded
(``--grid``, experiments/benchmarks/milp.json by default). All in plain steps (one plain step = 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_milp import budget_of  # noqa: E402

from poetlab import CostModel, build_paper_graph, load_platform  # noqa: E402
from poetlab.core.files import write_json_atomic  # noqa: E402
from poetlab.core.schedule import InvalidScheduleError, simulate  # noqa: E402
from poetlab.planners.poet.bounds import eviction_bound  # noqa: E402
from poetlab.planners.poet.intervals import interval_bound  # noqa: E402
from poetlab.planners.poet.milp import MilpOptions  # noqa: E402

ROWS = [
    ("resnet18_cifar", 0.1, 1.05), ("resnet18_cifar", 0.1, 1.5), ("resnet50", 0.1, 1.05), ("resnet50", 0.1, 1.5),
    ("bert", 0.1, 1.05), ("bert", 0.1, 1.5), ("bert", 0.5, 1.05), ("bert", 0.5, 1.5),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", default="experiments/benchmarks/interval_bound.json")
    parser.add_argument("--bounds-only", action="store_true", help="skip the solve with the budget less the largest tensor (the schedule)")
    parser.add_argument("--only", default=None, help="rows as model/fraction/factor, comma-separated (default: all eight)")
    parser.add_argument("--platform", default="m4")
    parser.add_argument("--grid", default="experiments/benchmarks/milp.json", help="the grid results whose best schedules to show beside")
    args = parser.parse_args()
    grid = {(r["model"], r["platform"], r["budget_fraction"], r["runtime_budget_factor"]): r for r in json.loads(Path(args.grid).read_text())["instances"] if r["bound"] == "eviction"}
    rows = []
    chosen = ROWS if args.only is None else [(m, float(f), float(x)) for m, f, x in (item.split("/") for item in args.only.split(","))]
    for model, fraction, factor in chosen:
        graph = build_paper_graph(model)
        costs = CostModel.from_flops(graph, load_platform(args.platform))
        ram = budget_of(graph, costs, fraction)
        options = MilpOptions(ram, factor)
        unit = costs.plain_step_energy_j
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        evicted = eviction_bound(graph, costs, options)
        eviction_s = time.perf_counter() - started
        exact = interval_bound(graph, costs, options, time_limit_s=args.time_limit)
        gaps = interval_bound(graph, costs, options, time_limit_s=args.time_limit, gap_rows=True)
        lp = interval_bound(graph, costs, options, time_limit_s=args.time_limit, integral=False)
        gaps_lp = interval_bound(graph, costs, options, time_limit_s=args.time_limit, gap_rows=True, integral=False)
        energy, why, margin_s = None, "not run (--bounds-only)", 0.0
        margin = float(graph.output_bytes.max())
        if not args.bounds_only:
            started_margin = time.perf_counter()
            start = interval_bound(graph, costs, replace(options, ram_budget_bytes=ram - margin), time_limit_s=args.time_limit, mip_gap=1e-4)
            margin_s = time.perf_counter() - started_margin
            try:
                energy = simulate(start.schedule, graph, costs, ram_budget_bytes=ram, runtime_budget_s=factor * costs.plain_step_runtime_s).energy_j / unit if start.schedule else None
                why = None if start.schedule else "no solution"
            except InvalidScheduleError as exc:
                energy, why = None, str(exc)
        best = grid.get((model, args.platform, fraction, factor), {})
        row = {
            "model": model, "platform": args.platform, "budget_fraction": fraction, "runtime_budget_factor": factor, "ram_budget_bytes": ram,
            "eviction_bound": evicted / unit, "eviction_s": eviction_s,
            "interval_bound": exact.bound_j / unit, "interval_optimal": exact.optimal, "interval_incumbent": exact.incumbent, "interval_s": exact.seconds,
            "interval_columns": exact.n_columns, "interval_rows": exact.n_rows,
            "gap_rows_bound": gaps.bound_j / unit, "gap_rows_optimal": gaps.optimal, "gap_rows_incumbent": gaps.incumbent, "gap_rows_s": gaps.seconds, "gap_rows_columns": gaps.n_columns,
            "interval_lp": lp.bound_j / unit, "interval_lp_s": lp.seconds, "gap_rows_lp": gaps_lp.bound_j / unit, "gap_rows_lp_s": gaps_lp.seconds,
            "margin_bytes": margin, "margin_schedule": energy, "margin_schedule_why_not": why, "margin_s": margin_s,
            "grid_best_schedule": best.get("energy_ratio"), "grid_time_limit_s": best.get("time_limit_s"),
            "time_limit_s": args.time_limit, "load_1min_before": load_before, "load_1min_after": os.getloadavg()[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_json_atomic(args.out, {"rows": rows})


if __name__ == "__main__":
    main()

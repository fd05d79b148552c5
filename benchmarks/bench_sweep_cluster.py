"""The sweep engine on a Dask cluster of one worker process against two (``distributed.LocalCluster``, one
thread each, 127.0.0.1 only), on a grid whose solves all certify (so that a run's time is solver work,
not time limits): Fig. 3's default preset on the m0 and a72 panels, 8 cases x 3 budgets = 24 tasks, with
a 300 s limit none reaches.
Runs alternate 1, 2, 2, 1, ... workers; each cluster starts before its clock does (a cluster is started
once per allocation, not per sweep), and every run's rows are checked against the first's (the same
grid and statuses, energies within the MIP gap). Also counts
the full preset's tasks and MILP solves per sweep stage.

    .venv/bin/python benchmarks/bench_sweep_cluster.py [--rounds 2] [--output experiments/benchmarks/sweep_cluster.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import replace

from distributed import LocalCluster

from poetlab.core.files import write_json_atomic
from poetlab.planners.baselines.milp_variants import MILP_VARIANTS
from poetlab.reproduction.config import stage_config
from poetlab.reproduction.sweep import budget_tasks, sweep

SWEEP_STAGES = ("fig3_frontier", "fig4_runtime", "fig5_capuchin", "table3_pofo")


def full_preset_counts() -> dict[str, dict[str, float]]:
    counts = {}
    for stage in SWEEP_STAGES:
        config = stage_config(stage, "full")
        tasks = len(budget_tasks(config))
        milp = sum(method in MILP_VARIANTS for method in config.methods)
        counts[stage] = {"tasks": tasks, "milp_solves": tasks * milp, "time_limit_s": config.time_limit_s, "threads": config.threads}
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="pairs of (1 worker, 2 workers) runs, alternating (default 2)")
    parser.add_argument("--output", default="experiments/benchmarks/sweep_cluster.json")
    args = parser.parse_args()
    os.environ.pop("POETLAB_CLUSTER", None)
    base = stage_config("fig3_frontier", "default")
    # a limit far above these solves' work, so that a loaded machine slows them without stopping them
    config = replace(base, cases=tuple(c for c in base.cases if c[1] in ("m0", "a72")), time_limit_s=300.0)
    same = ["model", "platform", "method", "budget_fraction", "ram_budget_bytes", "feasible", "status"]
    loopback = dict(host="127.0.0.1", dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0")
    order = [n for i in range(args.rounds) for n in ((1, 2) if i % 2 == 0 else (2, 1))]
    times: dict[int, list[float]] = {1: [], 2: []}
    first = None
    for workers in order:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, **loopback) as cluster:
            start = time.perf_counter()
            rows = sweep(config, cluster.scheduler_address)
            times[workers].append(time.perf_counter() - start)
        assert set(rows.status) == {"optimal"}, "a solve stopped at its limit: its time is not work"
        if first is None:
            first = rows
        # certified within mip_gap: another run may return another schedule within the gap, never a worse one
        assert rows[same].equals(first[same]), "the grid differs between runs"
        assert ((rows.energy_j - first.energy_j).abs() <= config.mip_gap * first.energy_j).all(), "energies differ beyond the gap"
        print(f"{workers} worker(s): {times[workers][-1]:.1f} s", flush=True)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    result = {
        "grid": "fig3_frontier default preset, platforms m0 and a72, time limit 300 s", "tasks": len(budget_tasks(config)),
        "solve_time_s_sum_of_rows": float(first.plan_time_s.sum()),
        "wall_s": {str(k): [round(t, 2) for t in v] for k, v in times.items()},
        "median_wall_s_1_worker": round(one, 2), "median_wall_s_2_workers": round(two, 2), "speedup_2_vs_1": round(one / two, 2),
        "cpus": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
        "full_preset": full_preset_counts(),
    }
    write_json_atomic(args.output, result)
    print(result)


if __name__ == "__main__":
    main()

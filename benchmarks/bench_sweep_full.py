"""The full preset's sweeps: how many tasks and MILP solves they hold, how long a sampled few of their tasks
take on this machine (each at the preset's own limit, 300 s per MILP, 2 threads), and the wall time that
projects on 1, 8 and 64 workers. Tasks are drawn at random (``--seed``) from Fig. 3 and Fig. 4 in turn and
solved one at a time in this process; the JSON is rewritten after each, so a run stopped by ``--budget-s``
keeps what it measured.

    .venv/bin/python benchmarks/bench_sweep_full.py [--samples 10] [--seed 7] [--budget-s 2400]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import time

from poetlab.core.files import write_json_atomic
from poetlab.planners.baselines.milp_variants import MILP_VARIANTS
from poetlab.reproduction.config import stage_config
from poetlab.reproduction.params import stage_params
from poetlab.reproduction.sweep import budget_tasks, comparison_sweep, solve_budget

STAGES = ("baselines", "fig3_frontier", "fig4_runtime", "fig5_capuchin", "table3_pofo")
SAMPLED = ("fig3_frontier", "fig4_runtime")
WORKERS = (1, 8, 64)


def full_config(stage: str):
    return comparison_sweep(**stage_params(stage, "full")) if stage == "baselines" else stage_config(stage, "full")


def counts() -> dict[str, dict[str, float]]:
    out = {}
    for stage in STAGES:
        config = full_config(stage)
        tasks = len(budget_tasks(config))
        milps = sum(method in MILP_VARIANTS for method in config.methods)
        out[stage] = {"tasks": tasks, "milp_solves_at_most": tasks * milps, "worst_task_s": milps * config.time_limit_s, "threads": config.threads}
    return out


def projection(per_stage: dict[str, dict[str, float]], mean_s: dict[str, float], longest_s: dict[str, float]) -> dict[str, float]:
    """Hours on each number of workers (one task each at a time), stages one after another as ``dvc repro``
    runs them; per stage the larger of its work spread evenly (``tasks x mean / workers``) and its longest
    task. With every task at its worst (``mean = longest``) that is ``ceil(tasks / workers)`` rounds."""
    def stage_s(stage: str, n: int) -> float:
        tasks = per_stage[stage]["tasks"]
        if mean_s[stage] == longest_s[stage]:
            return math.ceil(tasks / n) * mean_s[stage]
        return max(tasks * mean_s[stage] / n, longest_s[stage])
    return {str(n): round(sum(stage_s(s, n) for s in per_stage) / 3600, 2) for n in WORKERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10, help="tasks to time, Fig. 3 and Fig. 4 in turn (default 10)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=2400.0, help="start no sample after this many seconds (default 2400)")
    parser.add_argument("--output", default="experiments/benchmarks/sweep_full.json")
    args = parser.parse_args()
    per_stage = counts()
    pools = {}
    for stage in SAMPLED:
        tasks = budget_tasks(full_config(stage))
        pools[stage] = [(stage, i, tasks[i]) for i in random.Random(args.seed).sample(range(len(tasks)), len(tasks))]
    order = [item for pair in itertools.zip_longest(*pools.values()) for item in pair if item is not None][: args.samples]
    samples: list[dict[str, object]] = []
    started = time.monotonic()
    for stage, index, task in order:
        if time.monotonic() - started > args.budget_s:
            break
        start = time.perf_counter()
        rows = solve_budget(task)
        samples.append({
            "stage": stage, "task": index, "model": task.model, "platform": task.platform.name, "fraction": task.fraction,
            "runtime_factor": task.runtime_factor, "wall_s": round(time.perf_counter() - start, 1),
            "rows": [{"method": r["method"], "status": r["status"], "mip_gap": r["mip_gap"], "plan_time_s": round(r["plan_time_s"], 1)} for r in rows],
        })
        # sampled stages from their samples (mean and longest task), the others at their worst (every MILP at its limit)
        mean = {s: statistics.mean(x["wall_s"] for x in samples if x["stage"] == s) for s in SAMPLED if any(x["stage"] == s for x in samples)}
        longest = {s: max(x["wall_s"] for x in samples if x["stage"] == s) for s in mean}
        worst = {s: c["worst_task_s"] for s, c in per_stage.items()}
        write_json_atomic(args.output, {
            "full_preset": per_stage, "samples": samples, "mean_sampled_task_s": {s: round(m, 1) for s, m in mean.items()},
            "projected_hours_worst_case": projection(per_stage, worst, worst),
            "projected_hours_sampled": projection(per_stage, worst | mean, worst | longest),
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
        })
        print(samples[-1], flush=True)


if __name__ == "__main__":
    main()

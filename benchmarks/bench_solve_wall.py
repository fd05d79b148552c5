"""Wall time of ``poetlab solve --time-limit 1``, the whole command (interpreter start, imports, graph,
bound, quick starts, the MILP's worker), on each model of issue 28's grid at its hardest corner (m4, 10% of
the way from the smallest footprint to checkpoint-all, runtime 1.05x).

    .venv/bin/python benchmarks/bench_solve_wall.py [--repeats N] [--out FILE]

Issue 28 asks for at most 4 s. Results, with ``uptime``'s load before each run, go to
experiments/benchmarks/solve_wall.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.files import write_json_atomic

sys.path.insert(0, str(Path(__file__).parent))
from bench_milp import MODELS, budget_of  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="experiments/benchmarks/solve_wall.json")
    args = parser.parse_args()
    poetlab = str(Path(sys.executable).with_name("poetlab"))
    rows = []
    for model in MODELS:
        graph = build_paper_graph(model)
        ram = budget_of(graph, CostModel.from_flops(graph, load_platform("m4")), 0.1)
        for _ in range(args.repeats):
            load = os.getloadavg()[0]
            started = time.perf_counter()
            done = subprocess.run(
                [poetlab, "solve", "--model", model, "--platform", "m4", "--ram-budget", str(int(ram)), "--runtime-budget", "1.05", "--time-limit", "1", "--threads", "1"],
                capture_output=True, text=True,
            )
            wall = time.perf_counter() - started
            rows.append({"model": model, "ram_budget_bytes": int(ram), "wall_s": wall, "exit_code": done.returncode, "load_1min_before": load, "last_line": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]})
            print(f"{model}: {wall:.2f} s (exit {done.returncode}, load {load:.1f})", flush=True)
    write_json_atomic(args.out, {"command": "poetlab solve --platform m4 --runtime-budget 1.05 --time-limit 1 --threads 1", "runs": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

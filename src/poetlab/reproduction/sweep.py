"""Solve a grid into tidy rows: one row per (model, platform, runtime budget, memory budget, method),
the columns of :class:`poetlab.planners.comparison.ComparisonRow`. Every figure of the paper is drawn from such
rows; energy, runtime and peak always come from the simulator, and MILP rows carry their status and gap.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import pandas as pd
from tqdm.auto import tqdm

from poetlab.planners.baselines import PlanOptions
from poetlab.planners.comparison import ComparisonRow, compare_methods
from poetlab.core.costs import CostModel
from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import load_platform
from poetlab.reproduction.config import SweepConfig

COLUMNS: tuple[str, ...] = tuple(ComparisonRow.__dataclass_fields__)


def sweep(config: SweepConfig) -> pd.DataFrame:
    """Every method of ``config`` at every budget of every case, one case per worker process when
    ``config.workers`` > 1 (rows come back in the grid's order whatever finishes first). Graphs and
    platforms are all built before the first solve, so a bad name fails at once."""
    for model in dict.fromkeys(m for m, _ in config.cases):
        build_paper_graph(model, config.batch_size)
    for platform in dict.fromkeys(p for _, p in config.cases):
        load_platform(platform)
    jobs = [(model, platform, factor, config) for model, platform in config.cases for factor in config.runtime_factors]
    progress = dict(desc="sweep", unit="case", total=len(jobs))
    if config.workers > 1 and len(jobs) > 1:
        # spawned, not forked: the caller may be a Jupyter kernel with threads and signal handlers of its own
        with ProcessPoolExecutor(max_workers=min(config.workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(tqdm(pool.map(_solve_case, jobs), **progress))
    else:
        parts = [_solve_case(job) for job in tqdm(jobs, **progress)]
    return pd.DataFrame([row for part in parts for row in part], columns=list(COLUMNS))


def _solve_case(job: tuple[str, str, float, SweepConfig]) -> list[dict[str, object]]:
    """One (model, platform, runtime budget): every method at every memory budget, as dicts."""
    model, platform, factor, config = job
    graph = build_paper_graph(model, config.batch_size)
    costs = CostModel.from_flops(graph, load_platform(platform))
    options = PlanOptions(time_limit_s=config.time_limit_s, threads=config.threads, mip_gap=config.mip_gap)
    return [asdict(row) for row in compare_methods(graph, costs, config.fractions, factor, config.methods, options)]


def read_rows(path) -> pd.DataFrame:
    """Rows written by a sweep stage (CSV), with the boolean column restored."""
    rows = pd.read_csv(path)
    rows["feasible"] = rows["feasible"].astype(bool)
    return rows

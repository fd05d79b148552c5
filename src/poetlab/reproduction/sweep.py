"""Solve a grid into tidy rows: one row per (model, platform, runtime budget, memory budget, method),
the columns of :class:`poetlab.comparison.ComparisonRow`. Every figure of the paper is drawn from such
rows; energy, runtime and peak always come from the simulator, and MILP rows carry their status and gap.
"""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
from tqdm.auto import tqdm

from poetlab.baselines import PlanOptions
from poetlab.comparison import ComparisonRow, compare_methods
from poetlab.costs import CostModel
from poetlab.paper_models import build_paper_graph
from poetlab.platforms import load_platform
from poetlab.reproduction.config import SweepConfig

COLUMNS: tuple[str, ...] = tuple(ComparisonRow.__dataclass_fields__)


def sweep(config: SweepConfig) -> pd.DataFrame:
    """Every method of ``config`` at every budget of every case. Graphs and platforms are all built
    before the first solve, so a bad name fails at once."""
    graphs = {model: build_paper_graph(model, config.batch_size) for model in dict.fromkeys(m for m, _ in config.cases)}
    platforms = {name: load_platform(name) for name in dict.fromkeys(p for _, p in config.cases)}
    options = PlanOptions(time_limit_s=config.time_limit_s, threads=config.threads)
    jobs = [(model, platform, factor) for model, platform in config.cases for factor in config.runtime_factors]
    rows = []
    for model, platform, factor in tqdm(jobs, desc="sweep", unit="case"):
        graph = graphs[model]
        costs = CostModel.from_flops(graph, platforms[platform])
        rows += [asdict(row) for row in compare_methods(graph, costs, config.fractions, factor, config.methods, options)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_rows(path) -> pd.DataFrame:
    """Rows written by a sweep stage (CSV), with the boolean column restored."""
    rows = pd.read_csv(path)
    rows["feasible"] = rows["feasible"].astype(bool)
    return rows

"""The memory-vs-energy frontier of POET, POET with compression, and sparse update, on one graph.

For each RAM budget, the minimum energy found by ``poetlab.solve`` on the same graph and platform:
``poet`` (keep, recompute, page), ``poet+compression`` (and keep compressed, from profiled densities;
:mod:`poetlab.techniques.compression`), ``sparse update`` (POET on the graph of a sparse-update scheme:
for a real model the traced graph of the scheme applied for real,
:func:`poetlab.techniques.transforms.scheme_graph`, given as ``sparse_graph``; for a paper graph the
layers before ``first_trained`` frozen, :func:`poetlab.techniques.transforms.sparse_update_graph`. A
different, cheaper training step, so its curve sits lower and further left). Every point is a schedule replayed by the
simulator. :func:`frontier_figure` draws the table; the pipeline calls both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import pandas as pd

from poetlab.core.costs import CostModel
from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import TrainingGraph
from poetlab.core.platforms import Platform
from poetlab.planners.poet.solver import solve
from poetlab.techniques.compression import compression_costs
from poetlab.techniques.transforms import sparse_update_graph

METHODS = ("poet", "poet+compression", "sparse update")


def frontier_table(
    graph: TrainingGraph,
    platform: Platform,
    densities: Mapping[int, float],
    budgets_bytes: Sequence[float],
    runtime_budget_factor: float | None = 2.0,
    first_trained: int | None = None,
    margin: float = 0.1,
    time_limit_s: float = 60.0,
    mip_gap: float = 1e-6,
    threads: int | None = 1,
    solver: str = "auto",
    sparse_graph: TrainingGraph | None = None,
) -> pd.DataFrame:
    """One row per (method, budget). The compression solve gets twice ``time_limit_s`` and starts from
    its own POET solve at ``time_limit_s``, so it is never above that solve (a separate time-limited POET
    row may differ a little; optimal ones agree); sparse update is planned on ``sparse_graph`` (a
    scheme's graph of the same model) or on ``graph`` with the layers before ``first_trained`` frozen,
    and left out when both are None. ``solver`` is passed to :func:`poetlab.solve` (``highs`` gives the same backend on every host)."""
    costs = CostModel.from_flops(graph, platform).with_compression(compression_costs(graph, platform, densities, margin))
    cases: list[tuple[str, TrainingGraph, CostModel, bool, float]] = [
        ("poet", graph, costs, False, time_limit_s),
        ("poet+compression", graph, costs, True, 2 * time_limit_s),
    ]
    if first_trained is not None and sparse_graph is not None:
        raise InvalidArgumentError("give sparse_graph (a scheme's graph) or first_trained (a paper graph's frozen prefix), not both")
    frozen = sparse_update_graph(graph, first_trained) if first_trained is not None else sparse_graph
    if frozen is not None:
        cases.append(("sparse update", frozen, CostModel.from_flops(frozen, platform), False, time_limit_s))
    rows = []
    for budget in budgets_bytes:
        for method, g, c, compress, limit in cases:
            result = solve(g, c, float(budget), runtime_budget_factor, compression=compress, time_limit_s=limit, mip_gap=mip_gap, threads=threads, solver=solver)
            rows.append(
                {
                    "model": graph.name, "platform": platform.name, "method": method, "ram_budget_bytes": float(budget),
                    "feasible": result.feasible, "status": result.status, "energy_j": result.energy_j,
                    "peak_ram_bytes": result.peak_ram_bytes, "n_recomputes": result.n_recomputes, "n_pageouts": result.n_pageouts,
                    "n_compresses": result.n_compresses, "compression_energy_j": result.compression_energy_j,
                    "mip_gap": result.mip_gap, "solve_time_s": result.solve_time_s,
                }
            )
    return pd.DataFrame(rows)


def frontier_figure(table: pd.DataFrame) -> plt.Figure:
    """Energy of one training step against the RAM budget, one line per method; a method with no
    schedule at a budget has no point there."""
    import seaborn as sns

    from poetlab.reproduction.plotting import STYLE

    sns.set_theme(**STYLE)
    data = table[table.feasible].assign(budget_kb=lambda t: t.ram_budget_bytes / 1e3, energy=lambda t: t.energy_j.astype(float))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sns.lineplot(data=data, x="budget_kb", y="energy", hue="method", style="method", hue_order=[m for m in METHODS if m in set(data.method)], markers=True, dashes=False, ax=ax)
    ax.set_xlabel("RAM budget (kB)")
    ax.set_ylabel("energy of one training step (J)")
    first = table.iloc[0]
    ax.set_title(f"{first.model} on {first.platform}")
    fig.tight_layout()
    return fig

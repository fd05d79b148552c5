"""The paper's Fig. 4: total energy of one training step across runtime budgets, for POET (remat and
paging together), remat only (Checkmate's MILP) and paging only, at one memory budget.

Paging time is not counted in the runtime budget (the release's rule), so paging only is the same at
every runtime budget; remat only needs a looser runtime budget as memory gets tighter. Integration can
only win where remat only is infeasible or dear: between 1.0 and each case's remat threshold, the
smallest runtime factor at which remat only has a schedule (:func:`remat_threshold`), so the stage samples
that window in every case (:func:`window_factors`)."""

from __future__ import annotations

import dataclasses
import os

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from poetlab.reproduction.config import SweepConfig
from poetlab.reproduction.params import PARAMS_FILE
from poetlab.reproduction.plotting import STYLE, mark_time_limited

#: the runtime factor of the remat-only solve that finds the threshold: loose enough never to bind
LOOSE_RUNTIME_FACTOR = 100.0


def remat_threshold(model: str, platform: str, config: SweepConfig) -> dict[str, object]:
    """The smallest runtime factor at which remat only (Checkmate's MILP) has a schedule at the stage's
    memory budget: remat only's minimum energy with a runtime budget that never binds, as a factor of one
    plain step's runtime (on the flop cost model a node's energy and time are both proportional to its
    flops, so the minimum-energy remat schedule is also the fastest). A solve stopped at its time limit
    gives an upper bound (``status``, ``mip_gap``); None: remat only cannot meet the memory budget."""
    from poetlab.core.costs import CostModel
    from poetlab.core.paper_models import build_paper_graph
    from poetlab.core.platforms import load_platform
    from poetlab.planners.baselines import PlanOptions
    from poetlab.planners.comparison import compare_methods

    graph = build_paper_graph(model, config.batch_size)
    costs = CostModel.from_flops(graph, load_platform(platform))
    options = PlanOptions(time_limit_s=config.time_limit_s, threads=config.threads, mip_gap=config.mip_gap)
    (row,) = compare_methods(graph, costs, config.fractions, LOOSE_RUNTIME_FACTOR, ("checkmate",), options)
    factor = float(row.runtime_s / costs.plain_step_runtime_s) if row.feasible else None
    return {"model": model, "platform": platform, "remat_threshold": factor, "status": row.status, "mip_gap": row.mip_gap}


def window_factors(config: SweepConfig, threshold: float | None) -> tuple[float, ...]:
    """The stage's runtime factors plus, where remat only has a threshold t above 1, the points
    1 + p (t - 1) of ``config.remat_window_points`` (rounded to 1e-6)."""
    extra = [] if threshold is None or not threshold > 1.0 + 1e-9 else [round(1 + p * (threshold - 1), 6) for p in config.remat_window_points]
    return tuple(sorted(set(config.runtime_factors) | set(extra)))


def window_sweep(config: SweepConfig, cluster: str | None = None, params_file: str | os.PathLike[str] = PARAMS_FILE) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The stage's rows and each case's threshold: every case swept (:func:`poetlab.reproduction.sweep.sweep`,
    locally or on ``cluster``) at the stage's runtime factors plus the points of its own window
    (:func:`window_factors` of its :func:`remat_threshold`). What the notebook and ``poetlab sweep`` both run."""
    from poetlab.reproduction.sweep import sweep

    thresholds = pd.DataFrame([remat_threshold(model, platform, config) for model, platform in config.cases])
    parts = [
        sweep(dataclasses.replace(config, cases=(case,), runtime_factors=window_factors(config, threshold)), cluster, params_file)
        for case, threshold in zip(config.cases, thresholds.remat_threshold.astype(float), strict=True)
    ]
    return pd.concat(parts, ignore_index=True), thresholds


LABELS = {"poet": "POET (integrated)", "checkmate": "remat only", "paging_only": "paging only"}


#: POET drawn wide and underneath, so that where it coincides with a one-lever method both stay visible.
STYLES = {"poet": dict(lw=5, alpha=0.35, marker="o", ms=9, zorder=1), "checkmate": dict(lw=1.5, marker="s", ms=5, zorder=3),
          "paging_only": dict(lw=1.5, marker="x", ms=6, zorder=2)}


def runtime_figure(rows: pd.DataFrame) -> plt.Figure:
    """Energy (J) against the runtime budget (factor of one plain step), one panel per case; a method
    with no schedule within a runtime budget has no point there. The dashed line is one plain step's
    energy, the lower bound of every schedule."""
    sns.set_theme(**STYLE)
    cases = list(dict.fromkeys(zip(rows.model, rows.platform, strict=True)))
    width = 3.8 * len(cases) + 2.6  # the last 2.6 inches hold the legend
    fig, axes = plt.subplots(1, len(cases), figsize=(width, 3.4), squeeze=False)
    colors = dict(zip(LABELS, sns.color_palette(n_colors=len(LABELS)), strict=True))
    for ax, (model, platform) in zip(axes[0], cases, strict=True):
        case = rows[(rows.model == model) & (rows.platform == platform) & rows.feasible].sort_values("runtime_budget_factor")
        for method in [m for m in LABELS if m in set(rows.method)]:
            line = case[case.method == method]
            ax.plot(line.runtime_budget_factor, line.energy_j, color=colors[method], label=LABELS[method], **STYLES[method])
        mark_time_limited(ax, case, case.runtime_budget_factor, case.energy_j)
        if len(case):
            plain = float((case.energy_j / (1 + case.energy_overhead)).iloc[0])
            ax.axhline(plain, color="grey", ls="--", lw=1, label="one plain step (lower bound)")
        ax.set_title(f"{model} / {platform}")
        ax.set_xlabel("runtime budget (x one plain step)")
    axes[0][0].set_ylabel("energy of one training step (J)")
    legend = {}
    for ax in axes[0]:
        legend.update({label: handle for handle, label in zip(*ax.get_legend_handles_labels(), strict=True) if label not in legend})
    fig.legend(list(legend.values()), list(legend), loc="center right", frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / width, 1))
    return fig


def runtime_comparison(rows: pd.DataFrame, gap_tolerance: float = 0.0) -> pd.DataFrame:
    """Per (case, runtime budget): each method's energy and whether POET is at or below both one-lever
    methods (within its MIP gap plus ``gap_tolerance``) and feasible wherever either is."""
    out = []
    for (model, platform, factor), at in rows.groupby(["model", "platform", "runtime_budget_factor"], sort=False):
        energy = {m: (float(r.energy_j) if r.feasible else None) for m, r in at.set_index("method").iterrows()}
        poet = at[at.method == "poet"].iloc[0]
        gap = 0.0 if pd.isna(poet.mip_gap) else float(poet.mip_gap)
        others = [e for m, e in energy.items() if m != "poet" and e is not None]
        best_other = min(others) if others else None
        if best_other is None:
            ok = True
        elif energy.get("poet") is None:
            ok = False
        else:
            ok = energy["poet"] <= best_other * (1 + gap + gap_tolerance) + 1e-12
        out.append({
            "model": model, "platform": platform, "runtime_budget_factor": float(factor),
            **{f"{m}_energy_j": energy.get(m) for m in LABELS},
            "poet_mip_gap": gap, "poet_saving_vs_best_other": None if best_other is None or energy.get("poet") is None else 1 - energy["poet"] / best_other,
            "poet_at_or_below_both": bool(ok),
        })
    return pd.DataFrame(out)


def runtime_metrics(rows: pd.DataFrame, gap_tolerance: float = 0.0, thresholds: pd.DataFrame | None = None) -> dict[str, object]:
    """Counts over the runtime budgets; ``thresholds`` (rows of :func:`remat_threshold`) are reported per case."""
    table = runtime_comparison(rows, gap_tolerance)
    feasible = rows[rows.feasible].groupby("method").size().to_dict()
    return {
        "n_rows": int(len(rows)),
        "n_runtime_budgets": int(len(table)),
        "poet_at_or_below_both": int(table.poet_at_or_below_both.sum()),
        "n_feasible": {m: int(feasible.get(m, 0)) for m in LABELS if m in set(rows.method)},
        "max_poet_saving_vs_best_other": None if table.poet_saving_vs_best_other.isna().all() else float(table.poet_saving_vs_best_other.max()),
        "remat_thresholds": {} if thresholds is None else {
            f"{r.model}/{r.platform}": {"factor": None if pd.isna(r.remat_threshold) else float(r.remat_threshold), "status": r.status,
                                        "mip_gap": None if pd.isna(r.mip_gap) else float(r.mip_gap)} for r in thresholds.itertuples()},
    }

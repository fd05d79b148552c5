"""The paper's Fig. 5: POET against Capuchin (ResNet-18 on the Raspberry Pi 4B in the paper): the energy
overhead over the full-memory baseline (one plain step: nothing recomputed or paged) as the RAM budget
shrinks. The paper reports +73% to +141% for Capuchin and under 1% for POET; the grey band marks the
paper's Capuchin range."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from poetlab.reproduction.plotting import STYLE

PAPER_CAPUCHIN_OVERHEAD = (0.73, 1.41)
PAPER_POET_OVERHEAD_BELOW = 0.01


def capuchin_figure(rows: pd.DataFrame) -> plt.Figure:
    """Energy overhead (%) against the RAM budget (MB, tighter to the right), POET and Capuchin."""
    sns.set_theme(**STYLE)
    data = rows[rows.feasible].assign(budget_mb=lambda t: t.ram_budget_bytes / 1e6, overhead_pct=lambda t: 100 * t.energy_overhead.clip(lower=0))  # -1e-16 is rounding
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.axhspan(100 * PAPER_CAPUCHIN_OVERHEAD[0], 100 * PAPER_CAPUCHIN_OVERHEAD[1], color="grey", alpha=0.15, lw=0, label="Capuchin in the paper")
    sns.lineplot(data=data, x="budget_mb", y="overhead_pct", hue="method", style="method", markers=True, dashes=False, ax=ax)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(0, max(250.0, 1.2 * data.overhead_pct.max()))
    ax.invert_xaxis()
    case = f"{rows.model.iloc[0]} on {rows.platform.iloc[0]}" if len(rows) else ""
    ax.set_title(f"POET vs Capuchin, {case}")
    ax.set_xlabel("RAM budget (MB)")
    ax.set_ylabel("energy over full-memory baseline (%)")
    ax.legend(title=None, fontsize=8)
    fig.tight_layout()
    return fig


def capuchin_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per budget: both methods' overhead (None: no schedule) side by side."""
    wide = rows.set_index(["budget_fraction", "ram_budget_bytes", "method"]).energy_overhead.unstack("method")
    wide = wide.reindex(columns=["poet", "capuchin"]).sort_index(ascending=False).reset_index()
    wide.columns = ["budget_fraction", "ram_budget_bytes", "poet_overhead", "capuchin_overhead"]
    gaps = rows[rows.method == "poet"].set_index("budget_fraction").mip_gap
    wide["poet_mip_gap"] = wide.budget_fraction.map(gaps).fillna(0.0).to_numpy()
    return wide


def capuchin_metrics(rows: pd.DataFrame) -> dict[str, object]:
    """Over the budgets below the full-memory one (fraction < 1), the range of each method's overhead."""
    tight = rows[rows.budget_fraction < 1]
    out: dict[str, object] = {"n_rows": int(len(rows)), "model": rows.model.iloc[0], "platform": rows.platform.iloc[0]}
    for method in ("poet", "capuchin"):
        mine = tight[(tight.method == method) & tight.feasible]
        out[method] = {
            "n_budgets": int((tight.method == method).sum()),
            "n_feasible": int(len(mine)),
            "min_overhead": None if mine.empty else float(mine.energy_overhead.min()),
            "max_overhead": None if mine.empty else float(mine.energy_overhead.max()),
        }
    return out

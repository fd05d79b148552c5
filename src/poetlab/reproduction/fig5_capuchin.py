"""The paper's Fig. 5: POET against Capuchin (ResNet-18 on the Raspberry Pi 4B in the paper): the energy
overhead over the full-memory baseline (one plain step: nothing recomputed or paged) as the RAM budget
shrinks. The paper reports +73% to +141% for Capuchin and under 1% for POET; the grey band marks the
paper's Capuchin range. One panel per platform: the paper's A72, where paging every activation out and
back costs under 0.1% of a step (so no swapping schedule can show a large overhead), and the M4, where
it costs about 15%.

POET's solve starts from Capuchin's schedule among others, so POET at or below Capuchin holds by
construction; a separate row, ``poet_no_capuchin``, is POET solved without that start, where the
comparison could fail."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from poetlab.reproduction.plotting import STYLE, mark_time_limited

PAPER_CAPUCHIN_OVERHEAD = (0.73, 1.41)
PAPER_POET_OVERHEAD_BELOW = 0.01
#: the methods of the figure and table, in order, with their legend labels
METHODS = {"poet": "POET", "poet_no_capuchin": "POET, no Capuchin start", "capuchin": "Capuchin"}
#: POET drawn wide and underneath, so that where the two POET rows coincide both stay visible
STYLES = {"poet": dict(lw=5, alpha=0.35, marker="o", ms=9, zorder=1), "poet_no_capuchin": dict(lw=1.5, marker="x", ms=6, zorder=3),
          "capuchin": dict(lw=1.5, marker="s", ms=5, zorder=2)}


def capuchin_figure(rows: pd.DataFrame) -> plt.Figure:
    """Energy overhead (%) against the RAM budget (MB, tighter to the right), POET and Capuchin, one
    panel per platform."""
    sns.set_theme(**STYLE)
    data = rows[rows.feasible].assign(budget_mb=lambda t: t.ram_budget_bytes / 1e6, overhead_pct=lambda t: 100 * t.energy_overhead.clip(lower=0))  # -1e-16 is rounding
    colours = dict(zip(METHODS, sns.color_palette(n_colors=len(METHODS)), strict=True))
    platforms = list(dict.fromkeys(rows.platform))
    fig, axes = plt.subplots(1, len(platforms), figsize=(4.6 * len(platforms), 3.6), squeeze=False)
    for ax, platform in zip(axes[0], platforms, strict=True):
        panel = data[data.platform == platform]
        ax.axhspan(100 * PAPER_CAPUCHIN_OVERHEAD[0], 100 * PAPER_CAPUCHIN_OVERHEAD[1], color="grey", alpha=0.15, lw=0, label="Capuchin in the paper (A72)")
        for method, label in METHODS.items():
            line = panel[panel.method == method].sort_values("budget_mb")
            if len(line):
                ax.plot(line.budget_mb, line.overhead_pct, label=label, color=colours[method], **STYLES[method])
        mark_time_limited(ax, panel, panel.budget_mb, panel.overhead_pct)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(0, max(250.0, 1.2 * (panel.overhead_pct.max() if len(panel) else 0)))
        ax.invert_xaxis()
        ax.set_title(f"{rows.model.iloc[0]} on {platform}")
        ax.set_xlabel("RAM budget (MB)")
        ax.set_ylabel("energy over full-memory baseline (%)")
        ax.legend(title=None, fontsize=8)
    fig.tight_layout()
    return fig


def capuchin_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (platform, budget): each method's overhead (None: no schedule) side by side, and the
    MIP gap of each POET row."""
    methods = [method for method in METHODS if method in set(rows.method)]
    poets = [method for method in methods if method != "capuchin"]
    parts = []
    for platform, case in rows.groupby("platform", sort=False):
        wide = case.set_index(["budget_fraction", "ram_budget_bytes", "method"]).energy_overhead.unstack("method")
        wide = wide.reindex(columns=methods).sort_index(ascending=False).reset_index()
        wide.columns = ["budget_fraction", "ram_budget_bytes", *(f"{method}_overhead" for method in methods)]
        for method in poets:
            gaps = case[case.method == method].set_index("budget_fraction").mip_gap
            wide[f"{method}_mip_gap"] = wide.budget_fraction.map(gaps).fillna(0.0).to_numpy()
        wide.insert(0, "platform", platform)
        parts.append(wide)
    return pd.concat(parts, ignore_index=True)


def capuchin_metrics(rows: pd.DataFrame) -> dict[str, object]:
    """Per platform, over the budgets below the full-memory one (fraction < 1), the range of each method's overhead."""
    out: dict[str, object] = {"n_rows": int(len(rows)), "model": rows.model.iloc[0], "platforms": {}}
    for platform, case in rows.groupby("platform", sort=False):
        tight = case[case.budget_fraction < 1]
        entry = {}
        for method in [method for method in METHODS if method in set(rows.method)]:
            mine = tight[(tight.method == method) & tight.feasible]
            entry[method] = {
                "n_budgets": int((tight.method == method).sum()),
                "n_feasible": int(len(mine)),
                "min_overhead": None if mine.empty else float(mine.energy_overhead.min()),
                "max_overhead": None if mine.empty else float(mine.energy_overhead.max()),
            }
        out["platforms"][platform] = entry
    return out

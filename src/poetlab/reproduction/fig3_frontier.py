"""The paper's Fig. 3: the energy of one training step against its peak memory, POET's frontier across
memory budgets, one panel per platform and one line per model, every point within the runtime budget.

A model's line runs from checkpoint-all's peak (nothing recomputed or paged: one plain step's energy) to
the smallest single-node footprint; a dotted vertical line marks the platform's RAM where it is known."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from poetlab.reproduction.plotting import STYLE, mark_time_limited


def frontier_figure(rows: pd.DataFrame, ram_bytes: Mapping[str, float | None] | None = None, platforms: Sequence[str] | None = None) -> plt.Figure:
    """Energy (J, log) against peak RAM (bytes, log) of POET's schedules; one panel per platform."""
    sns.set_theme(**STYLE)
    platforms = list(platforms or dict.fromkeys(rows.platform))
    data = rows[rows.feasible & (rows.method == "poet")].sort_values(["platform", "model", "peak_ram_bytes"])
    fig, axes = plt.subplots(1, len(platforms), figsize=(3.4 * len(platforms), 3.4), squeeze=False)
    models = list(dict.fromkeys(rows.model))
    palette = dict(zip(models, sns.color_palette(n_colors=len(models)), strict=True))
    for ax, platform in zip(axes[0], platforms, strict=True):
        panel = data[data.platform == platform]
        for model in models:
            line = panel[panel.model == model]
            if len(line):
                ax.plot(line.peak_ram_bytes / 1e6, line.energy_j, marker="o", ms=4, lw=1.2, color=palette[model], label=model)
        mark_time_limited(ax, panel, panel.peak_ram_bytes / 1e6, panel.energy_j)
        ram = (ram_bytes or {}).get(platform)
        if ram:
            ax.axvline(ram / 1e6, color="grey", ls=":", lw=1)
            ax.annotate("device RAM", (ram / 1e6, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=7, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(platform)
        ax.set_xlabel("peak memory (MB)")
    axes[0][0].set_ylabel("energy of one training step (J)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # every model's line and the time-limit ring, whichever panel has them
        more = ax.get_legend_handles_labels()
        for h, lab in zip(*more, strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def frontier_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model, platform): how far POET took peak memory down and what it cost in energy."""
    out = []
    for (model, platform), case in rows[rows.method == "poet"].groupby(["model", "platform"], sort=False):
        feasible = case[case.feasible]
        full = case[case.budget_fraction == case.budget_fraction.max()]
        tightest = feasible.loc[feasible.peak_ram_bytes.idxmin()] if len(feasible) else None
        out.append({
            "model": model, "platform": platform,
            "n_budgets": int(len(case)), "n_feasible": int(len(feasible)),
            "full_peak_ram_bytes": int(full.peak_ram_bytes.iloc[0]) if len(full) and full.feasible.iloc[0] else None,
            "min_peak_ram_bytes": None if tightest is None else int(tightest.peak_ram_bytes),
            "memory_reduction": None if tightest is None or not len(full) else float(full.peak_ram_bytes.iloc[0] / tightest.peak_ram_bytes),
            "energy_overhead_at_min_peak": None if tightest is None else float(tightest.energy_overhead),
            "max_energy_overhead": float(feasible.energy_overhead.max()) if len(feasible) else None,
            "max_mip_gap": float(feasible.mip_gap.max()) if feasible.mip_gap.notna().any() else 0.0,
            "n_at_time_limit": int((case.status == "time_limit").sum()),
        })
    return pd.DataFrame(out)


def frontier_metrics(rows: pd.DataFrame) -> dict[str, object]:
    summary = frontier_summary(rows)
    return {
        "n_rows": int(len(rows)),
        "n_infeasible": int((~rows.feasible).sum()),
        "max_memory_reduction": float(summary.memory_reduction.max()),
        "max_energy_overhead": float(summary.max_energy_overhead.max()),
        "cases": {f"{r.model}/{r.platform}": {"memory_reduction": r.memory_reduction, "energy_overhead_at_min_peak": r.energy_overhead_at_min_peak, "max_mip_gap": r.max_mip_gap}
                  for r in summary.itertuples()},
    }


def device_ram_bytes(platforms: Sequence[str]) -> dict[str, float | None]:
    """Each platform's RAM (bytes) from its file, None where the file does not say."""
    from poetlab.core.platforms import load_platform

    return {name: load_platform(name).ram_bytes for name in platforms}


def frontier_conclusion(rows: pd.DataFrame, ram_bytes: Mapping[str, float | None]) -> str:
    """The figure's closing text, computed from its rows (Markdown): how many budgets POET met, the largest
    energy overhead per platform, the points stopped at the time limit, and per platform whose RAM is known,
    which models' smallest POET peak fits in it and how far above it the others stay."""
    poet = rows[rows.method == "poet"]
    feasible = poet[poet.feasible]
    lines = [f"POET has a schedule at {len(feasible)} of {len(poet)} budgets (model, platform, memory budget), every one within the runtime budget."]
    overheads = "; ".join(f"{platform} {100 * case.energy_overhead.max():.3g}%" for platform, case in feasible.groupby("platform", sort=False))
    lines.append(f"Largest energy over one plain step, per platform: {overheads}.")
    stopped = poet[poet.status == "time_limit"]
    if len(stopped):
        worst = stopped.loc[stopped.mip_gap.idxmax()]
        lines.append(f"{len(stopped)} solves stopped at the time limit before they were certified (ringed; the largest MIP gap, "
                     f"{100 * worst.mip_gap:.3g}%, is {worst.model} on {worst.platform} at fraction {worst.budget_fraction:g}).")
    fitting = []
    for platform, case in feasible.groupby("platform", sort=False):
        ram = ram_bytes.get(platform)
        if not ram:
            continue
        smallest = case.groupby("model", sort=False).peak_ram_bytes.min()
        fits = [f"{model} ({int(peak):,} bytes)" for model, peak in smallest.items() if peak <= ram]
        above = smallest[smallest > ram] / ram
        text = f"On {platform} ({int(ram):,} bytes of RAM) " + (f"{', '.join(fits)} fit{'s' if len(fits) == 1 else ''}" if fits else "no model fits")
        if len(above):
            text += f"; the {'other ' if fits else ''}models' smallest peaks are {above.min():.3g}x to {above.max():.3g}x its RAM"
        fitting.append(text + ".")
    if fitting:
        lines += ["Each model's smallest peak against the device's RAM (the step's tensors: as in the paper, parameters are not in the budget).", *fitting]
    return " ".join(lines)

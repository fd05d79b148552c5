"""Figures of schedules and comparisons, with the kit's one seaborn style."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: the CLI and the pipeline run headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from poetlab.core.files import output_target  # noqa: E402
from poetlab.errors import OutputError  # noqa: E402
from poetlab.core.schedule import Schedule, SimulationResult  # noqa: E402

STYLE = {"style": "whitegrid", "context": "paper"}


def schedule_figure(schedule: Schedule, simulation: SimulationResult, ram_budget_bytes: float | None = None, title: str = "") -> plt.Figure:
    """R / S_RAM / S_SSD as stage x node heat maps, and the memory trace against the budget."""
    sns.set_theme(**STYLE)
    m = schedule.matrices()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), gridspec_kw={"width_ratios": [1, 1, 1, 1.6]})
    for ax, (name, matrix) in zip(axes[:3], (("R: computed", m.R), ("S_RAM: kept in RAM", m.S_RAM), ("S_SSD: on flash", m.S_SSD)), strict=True):
        sns.heatmap(matrix.astype(int), ax=ax, cmap="Blues", cbar=False, vmin=0, vmax=1, xticklabels=False, yticklabels=False, square=True)
        ax.set_title(name)
        ax.set_xlabel("node")
        ax.set_ylabel("stage")
    trace = simulation.memory_trace_bytes
    ax = axes[3]
    ax.plot(np.arange(trace.size), trace / 1e3, lw=1, label="RAM in use")
    if ram_budget_bytes is not None:
        ax.axhline(ram_budget_bytes / 1e3, color="crimson", ls="--", lw=1, label="budget")
    ax.set_xlabel("operation")
    ax.set_ylabel("kB")
    ax.set_title("memory trace")
    ax.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


#: the legend label of the ring drawn around a MILP point that stopped at its time limit
TIME_LIMITED_LABEL = "stopped at the time limit (not certified; gap in the table)"


def mark_time_limited(ax: plt.Axes, rows: pd.DataFrame, x: pd.Series, y: pd.Series) -> None:
    """Ring each point of ``rows`` whose solve stopped at its time limit (``status == "time_limit"``):
    such a point is the best schedule found, not POET's optimum. ``x`` and ``y`` are the plotted
    coordinates of ``rows`` (same index)."""
    stopped = rows.index[(rows.status == "time_limit").to_numpy()]
    if len(stopped):
        ax.scatter(x.loc[stopped], y.loc[stopped], s=110, facecolors="none", edgecolors="crimson", linewidths=1.4, zorder=5, label=TIME_LIMITED_LABEL)


def save_figure(fig: plt.Figure, path: str | os.PathLike[str]) -> Path:
    """Save with reproducible bytes (no timestamps in PDF or SVG metadata), then close the figure."""
    try:
        return _write_figure(fig, Path(path))
    finally:
        plt.close(fig)


def save_figures(fig: plt.Figure, stem: str | os.PathLike[str], formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Save ``stem.<format>`` for each format (the pipeline's PNG for reading, PDF for papers), then close."""
    try:
        return [_write_figure(fig, Path(f"{stem}.{suffix}")) for suffix in formats]
    finally:
        plt.close(fig)


def _write_figure(fig: plt.Figure, path: Path) -> Path:
    metadata = {".pdf": {"CreationDate": None}, ".svg": {"Date": None}}.get(path.suffix.lower())
    target = output_target(path)
    tmp = target.with_name(f".{target.name}.tmp{target.suffix}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=150, metadata=metadata)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; free some space or choose another path") from exc
    except ValueError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc}; use a .png, .pdf or .svg file name") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def comparison_figure(table: pd.DataFrame) -> plt.Figure:
    """Energy overhead over one plain step against the memory budget, one line per method and one panel
    per (model, platform); a method that cannot meet a budget has no point there."""
    sns.set_theme(**STYLE)
    data = table[table.feasible].assign(
        case=lambda t: t.model + " / " + t.platform,
        overhead_pct=lambda t: 100 * t.energy_overhead.astype(float),
    )
    cases = list(dict.fromkeys(table.model + " / " + table.platform))
    grid = sns.relplot(
        data=data, x="budget_fraction", y="overhead_pct", hue="method", style="method", col="case", col_order=cases,
        kind="line", markers=True, dashes=False, height=3.4, aspect=1.1, facet_kws={"sharey": False},
    )
    grid.set(xlim=(1.02, -0.02))  # tighter budgets to the right
    grid.set_axis_labels("memory budget (0: smallest footprint, 1: checkpoint-all peak)", "energy over a plain step (%)")
    grid.set_titles("{col_name}")
    for ax in grid.axes.flat:
        ax.set_yscale("symlog", linthresh=1.0)
    return grid.figure


def training_figure(
    plain_losses: list[float] | tuple[float, ...],
    scheduled_losses: list[float] | tuple[float, ...],
    scheduled_peak_bytes: list[int] | tuple[int, ...],
    plain_peak_bytes: list[int] | tuple[int, ...],
    predicted_peak_bytes: int | None = None,
    title: str = "",
) -> plt.Figure:
    """Loss per step of a plain and a scheduled run on one axis (identical curves overlap: the scheduled
    one is drawn dashed on top), and the allocator's peak per step of both beside the simulator's."""
    sns.set_theme(**STYLE)
    steps = np.arange(1, len(plain_losses) + 1)
    losses = pd.concat([
        pd.DataFrame({"step": steps, "loss": plain_losses, "run": "plain PyTorch"}),
        pd.DataFrame({"step": steps, "loss": scheduled_losses, "run": "POET schedule (executed)"}),
    ])
    fig, (ax_loss, ax_mem) = plt.subplots(1, 2, figsize=(11, 3.8))
    sns.lineplot(data=losses, x="step", y="loss", hue="run", style="run", dashes=[(1, 0), (4, 3)], ax=ax_loss, lw=1.2)
    ax_loss.set_title("training loss")
    ax_mem.plot(steps, np.asarray(plain_peak_bytes) / 1e6, lw=1, label="plain PyTorch (measured)")
    ax_mem.plot(steps, np.asarray(scheduled_peak_bytes) / 1e6, lw=1, label="POET schedule (measured)")
    if predicted_peak_bytes is not None:
        ax_mem.axhline(predicted_peak_bytes / 1e6, color="crimson", ls="--", lw=1, label="simulator: activations")
    ax_mem.set_xlabel("step")
    ax_mem.set_ylabel("peak MB above step start")
    ax_mem.set_ylim(bottom=0)
    ax_mem.set_title("allocator peak per step")
    ax_mem.legend(loc="lower right", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

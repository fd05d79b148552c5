"""Figures of a schedule, with the kit's one seaborn style."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: the CLI and the pipeline run headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

from poetlab.errors import OutputError  # noqa: E402
from poetlab.schedule import Schedule, SimulationResult  # noqa: E402

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


def save_figure(fig: plt.Figure, path: str | os.PathLike[str]) -> Path:
    """Save with reproducible bytes (no timestamps in PDF or SVG metadata), then close the figure."""
    path = Path(path)
    metadata = {".pdf": {"CreationDate": None}, ".svg": {"Date": None}}.get(path.suffix.lower())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
        fig.savefig(tmp, dpi=150, metadata=metadata)
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; free some space or choose another path") from exc
    except ValueError as exc:
        raise OutputError(f"cannot write {path}: {exc}; use a .png, .pdf or .svg file name") from exc
    finally:
        plt.close(fig)
    return path

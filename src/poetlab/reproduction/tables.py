"""Tidy tables the pipeline writes: one row per (model, platform, ...), CSV for machines and Markdown
for people, written atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from poetlab.core.files import write_text_atomic
from poetlab.core.costs import CostModel
from poetlab.errors import InvalidArgumentError
from poetlab.progress import progress_bar
from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import load_platform
from poetlab.core.summary import summarize_graph


def graph_table(
    models: Sequence[str],
    platforms: Sequence[str],
    batch_size: int = 1,
    platform_dir: str | os.PathLike[str] | None = None,
) -> pd.DataFrame:
    """One row per (model, platform): graph sizes and the costs of one plain training step.

    Every name is checked before any work is done, so a typo fails at once with the valid names.
    """
    specs = [load_platform(name, platform_dir) for name in platforms]
    graphs = [build_paper_graph(model, batch_size) for model in models]
    rows = [
        summarize_graph(graph, CostModel.from_flops(graph, platform)).to_dict()
        for graph in progress_bar(graphs, desc="graphs", unit="model")
        for platform in specs
    ]
    return pd.DataFrame(rows)


def write_table(
    table: pd.DataFrame, stem: str | os.PathLike[str], formats: tuple[str, ...] = ("csv", "md")
) -> tuple[Path, ...]:
    """Write ``stem.csv``, ``stem.md`` and, with ``"tex"`` in ``formats``, ``stem.tex`` (a LaTeX
    ``tabular`` for papers), each atomically. Returns the paths in the order of ``formats``."""
    stem = Path(stem)
    writers = {
        "csv": lambda: table.to_csv(index=False, float_format="%.12g"),
        "md": lambda: table.to_markdown(index=False, floatfmt=".6g") + "\n",
        "tex": lambda: _latex(table),
    }
    unknown = [suffix for suffix in formats if suffix not in writers]
    if unknown:
        raise InvalidArgumentError(f"unknown table format {unknown[0]!r}; valid formats: {', '.join(writers)}")
    return tuple(write_text_atomic(stem.with_name(f"{stem.name}.{suffix}"), writers[suffix]()) for suffix in formats)


def _latex(table: pd.DataFrame) -> str:
    """A booktabs-free ``tabular`` (no extra LaTeX packages needed), numbers to 6 significant digits."""
    return table.to_latex(index=False, float_format=lambda x: f"{x:.6g}", na_rep="--", escape=True)

"""Tidy tables the pipeline writes: one row per (model, platform, ...), CSV for machines and Markdown
for people, written atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from poetlab._io import write_text_atomic
from poetlab.costs import CostModel
from poetlab.paper_models import build_paper_graph
from poetlab.platforms import load_platform
from poetlab.summary import summarize_graph


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
        for graph in tqdm(graphs, desc="graphs", unit="model")
        for platform in specs
    ]
    return pd.DataFrame(rows)


def write_table(table: pd.DataFrame, stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``stem.csv`` and ``stem.md``."""
    stem = Path(stem)
    csv = write_text_atomic(stem.with_suffix(".csv"), table.to_csv(index=False, float_format="%.12g"))
    markdown = write_text_atomic(stem.with_suffix(".md"), table.to_markdown(index=False, floatfmt=".6g") + "\n")
    return csv, markdown

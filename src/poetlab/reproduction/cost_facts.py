"""What a platform's cost coefficients imply before any planner runs: how much paging costs against
computing, on one model's training graph.

Two claims rest on these numbers. Whether "paging costs more energy than compute" holds is a property of
the coefficients alone. And when paging every activation out and back costs less than a claimed bound
(POET within 1% of the full-memory energy), any planner that may page meets the bound: the check cannot
fail, and the claims table says so instead of calling it reproduced."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from poetlab.core.costs import CostModel
from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import load_platform


def paging_cost_table(model: str, platforms: Sequence[str], batch_size: int = 1) -> pd.DataFrame:
    """One row per platform, over the forward activations of ``model``'s training graph:

    - ``page_all_overhead``: paging every activation out once and back in, as a fraction of one plain
      step's energy (an upper bound on a paging schedule's overhead, since the release's runtime budget
      does not count paging time);
    - ``page_vs_forward_compute``: the same energy over the forward pass's compute energy;
    - ``bytes_dearer_to_page``: the share of activation bytes whose page-out and page-in cost more energy
      than recomputing the operator that made them."""
    graph = build_paper_graph(model, batch_size)
    forward = np.asarray(list(graph.forward_indices))
    nbytes = np.asarray(graph.output_bytes, dtype=float)[forward]
    rows = []
    for name in platforms:
        costs = CostModel.from_flops(graph, load_platform(name))
        page = costs.pageout_energy_j[forward] + costs.pagein_energy_j[forward]
        compute = costs.compute_energy_j[forward]
        rows.append({
            "model": model, "platform": name, "batch_size": batch_size,
            "plain_step_energy_j": float(costs.plain_step_energy_j),
            "page_all_energy_j": float(page.sum()),
            "page_all_overhead": float(page.sum() / costs.plain_step_energy_j),
            "page_vs_forward_compute": float(page.sum() / compute.sum()),
            "bytes_dearer_to_page": float(nbytes[page > compute].sum() / nbytes.sum()),
        })
    return pd.DataFrame(rows)

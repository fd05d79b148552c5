"""Not in the paper: the memory-vs-energy frontier of POET, POET with compression (our extension) and
sparse update on one conv chain, drawn by :mod:`poetlab.techniques.frontier`.

The model is a real one, :class:`poetlab.torch.models.ConvChain` (3x3 convolution + ReLU, ``depth`` times,
and a linear classifier), seeded, and every series plans a graph :func:`poetlab.torch.trace` made from it, with
cheap element-wise nodes fused into their convolutions (so a ReLU output is the convolution's node, and
recomputing it costs the convolution's flops): POET and POET+compression plan the plain step, sparse
update the step of ``sparse_scheme`` applied for real (:func:`poetlab.techniques.transforms.scheme_graph`:
frozen layers save nothing and have no backward node, and only trained parameters are charged). One model
and one cost basis (flops counted by PyTorch) for the three. Small enough for the compression MILP to
finish within the preset's limits; every ReLU output is given the configured density."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn

from poetlab.core.costs import CostModel
from poetlab.core.platforms import load_platform
from poetlab.planners.comparison import budget_ladder
from poetlab.reproduction.config import TechniquesFrontierConfig
from poetlab.techniques.frontier import METHODS, frontier_table
from poetlab.techniques.sparse_update import parse_scheme
from poetlab.techniques.transforms import scheme_graph
from poetlab.torch.models import ConvChain
from poetlab.torch.trace import trace

MODEL_NAME = "conv_chain_torch"


def conv_chain_graphs(config: TechniquesFrontierConfig, seed: int = 0):
    """(plain step's graph, sparse-update scheme's graph) of the seeded :class:`ConvChain`, batch 1."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = ConvChain(config.channels, config.side, config.depth).train()
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn((1, config.channels, config.side, config.side), generator=generator)
    targets = torch.randint(4, (1,), generator=generator)
    loss = nn.CrossEntropyLoss()
    graph = trace(module, inputs, loss, targets, fuse=True, name=MODEL_NAME)
    sparse = scheme_graph(module, parse_scheme(config.sparse_scheme, module), inputs, loss, targets, fuse=True, name=MODEL_NAME).graph
    return graph, sparse


def techniques_rows(config: TechniquesFrontierConfig) -> pd.DataFrame:
    """One row per (method, budget), with the budget's fraction between the smallest footprint (0)
    and checkpoint-all's peak (1) of the plain step (workspace added), and the energy over one plain step."""
    graph, sparse = conv_chain_graphs(config)
    platform = load_platform(config.platform)
    costs = CostModel.from_flops(graph, platform)
    budgets = dict(zip(budget_ladder(graph, costs, config.fractions), config.fractions, strict=True))
    densities = {i: config.relu_density for i, node in enumerate(graph.nodes) if "ReLU" in node.kind.split("+") and not node.is_backward}
    table = frontier_table(
        graph, platform, densities, list(budgets), config.runtime_factor, None, config.density_margin,
        config.time_limit_s, config.mip_gap, config.threads, config.solver, sparse_graph=sparse,
    )
    table.insert(3, "budget_fraction", table.ram_budget_bytes.map(budgets))
    table.insert(4, "sparse_scheme", config.sparse_scheme)
    table["energy_over_plain"] = table.energy_j.astype(float) / costs.plain_step_energy_j
    return table


def techniques_metrics(table: pd.DataFrame) -> dict[str, object]:
    """Per method: budgets solved, feasible, and the energy over one plain step at the tightest
    feasible budget; and whether compression ever lowered POET's energy (and where)."""
    out: dict[str, object] = {"n_rows": int(len(table)), "model": table.model.iloc[0], "platform": table.platform.iloc[0]}
    for method in METHODS:
        mine = table[table.method == method]
        feasible = mine[mine.feasible]
        tightest = feasible.loc[feasible.ram_budget_bytes.idxmin()] if len(feasible) else None
        out[method] = {
            "n_budgets": int(len(mine)), "n_feasible": int(len(feasible)),
            "tightest_budget_bytes": None if tightest is None else float(tightest.ram_budget_bytes),
            "energy_over_plain_at_tightest": None if tightest is None else float(tightest.energy_over_plain),
            "n_compresses": int(mine.n_compresses.fillna(0).sum()),
        }
    energy = table.pivot_table(index="ram_budget_bytes", columns="method", values="energy_j", aggfunc="first")
    both = energy.dropna(subset=["poet", "poet+compression"]) if {"poet", "poet+compression"} <= set(energy.columns) else energy.iloc[:0]
    saving = 1 - both["poet+compression"] / both["poet"] if len(both) else pd.Series(dtype=float)
    out["compression_max_saving"] = float(saving.max()) if len(saving) else None
    out["compression_never_worse"] = bool((saving >= -1e-9).all())
    return out

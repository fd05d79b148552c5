"""Where each model can train at all, and how much more memory training needs than inference.

- The smallest memory in which a model trains is the smallest single-node footprint (a node's output and
  inputs in RAM at once): no schedule fits below it, and with paging (whose time the release's runtime
  budget does not count) one always fits at it. We do not take that on faith: a greedy paging schedule
  at exactly that budget is replayed by the simulator, and its energy is reported (an upper bound on
  POET's). The paper: ResNet-18 and BERT fine-tune within Cortex-M class memory.
- Train vs inference: training with every activation kept (checkpoint-all's peak) against inference, a
  forward pass that frees each activation after its last forward reader. The paper: over 200x for
  ResNet-50. Both are given for activations only (parameters outside, as in the release's budget) and
  with parameters (inference: weights; training: weights and their gradients). The paper's ratio has a
  second reading, a training batch against single-image inference: ``batch_for_ratio`` is the smallest
  batch at which checkpoint-all's activations exceed 200x a single image's inference peak.
"""

from __future__ import annotations

from collections.abc import Sequence

import math

import numpy as np
import pandas as pd

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.heuristics import greedy_paging_schedule
from poetlab.core.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.core.platforms import Platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import InvalidScheduleError, checkpoint_all_schedule, simulate

PAPER_TRAIN_INFERENCE_RATIO = 200.0
CORTEX_M_PLATFORMS = ("m0", "m4")


def inference_peak_bytes(graph: TrainingGraph) -> int:
    """Peak activation RAM of a forward pass that frees each tensor after its last forward reader."""
    forward = graph.forward_indices
    nbytes = graph.output_bytes
    position = {node: k for k, node in enumerate(forward)}
    last_reader = {node: position[node] for node in forward}
    for k, node in enumerate(forward):
        for source in set(graph.nodes[node].inputs):
            if source in last_reader:
                last_reader[source] = max(last_reader[source], k)
    live = 0
    peak = 0
    for k, node in enumerate(forward):
        live += int(nbytes[node])
        peak = max(peak, live)
        live -= sum(int(nbytes[n]) for n in forward[: k + 1] if last_reader[n] == k)
    return peak


def crossing_batch(model: str, ratio: float = PAPER_TRAIN_INFERENCE_RATIO, max_batch: int = 4096) -> int | None:
    """The smallest batch at which training ``model`` (checkpoint-all's activations) needs over ``ratio``
    times the activation memory of single-image inference; None above ``max_batch``. Training memory
    grows about linearly with the batch, so the search starts at ratio / (the batch-1 ratio) and steps.
    None also for a model without a batch dimension in the release (BERT: one sequence)."""
    if not PAPER_MODELS[model].batched:
        return None
    inference = inference_peak_bytes(build_paper_graph(model, 1))

    def above(batch: int) -> bool:
        return _checkpoint_all_peak(build_paper_graph(model, batch)) > ratio * inference

    batch = min(max_batch, max(1, math.ceil(ratio * inference / _checkpoint_all_peak(build_paper_graph(model, 1)))))
    while not above(batch):
        if batch >= max_batch:
            return None
        batch += 1
    while batch > 1 and above(batch - 1):
        batch -= 1
    return batch


def memory_ratio_table(models: Sequence[str], batch_size: int = 1) -> pd.DataFrame:
    rows = []
    for model in models:
        graph = build_paper_graph(model, batch_size)
        train = _checkpoint_all_peak(graph)
        inference = inference_peak_bytes(graph)
        params = graph.param_bytes
        rows.append({
            "model": model, "batch_size": batch_size,
            "inference_peak_bytes": inference, "train_peak_bytes": train,
            "train_vs_inference": train / inference,
            "param_bytes": params,
            "train_vs_inference_with_params": (train + 2 * params) / (inference + params),
            "batch_for_ratio": crossing_batch(model),
        })
    return pd.DataFrame(rows).astype({"batch_for_ratio": "Int64"})


def _checkpoint_all_peak(graph: TrainingGraph) -> int:
    """Checkpoint-all's simulated peak, which depends on the graph alone (unit costs stand in)."""
    ones = np.ones(graph.n_nodes)
    costs = CostModel("unit", ones, ones, ones, ones, ones, ones)
    return simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes


def feasibility_table(models: Sequence[str], platforms: Sequence[Platform], batch_size: int = 1) -> pd.DataFrame:
    """One row per (model, platform): the smallest RAM in which the model trains, whether a schedule
    at that budget replays, its energy overhead, and whether it fits the device's RAM."""
    rows = []
    for model in models:
        graph = build_paper_graph(model, batch_size)
        footprint, node = min_footprint_bytes(graph)
        for platform in platforms:
            costs = CostModel.from_flops(graph, platform)
            schedule = greedy_paging_schedule(graph, costs, footprint)
            overhead = None
            if schedule is not None:
                try:
                    sim = simulate(schedule, graph, costs, ram_budget_bytes=footprint, runtime_budget_s=costs.plain_step_runtime_s)
                    overhead = sim.energy_j / costs.plain_step_energy_j - 1
                except InvalidScheduleError:
                    overhead = None
            device = None if platform.ram_bytes is None else int(platform.ram_bytes)
            rows.append({
                "model": model, "platform": platform.name, "batch_size": batch_size,
                "min_train_ram_bytes": footprint, "bottleneck_node": graph.nodes[node].name,
                "verified_by_schedule": overhead is not None, "energy_overhead_at_min": overhead,
                "device_ram_bytes": device,
                "fits_device_ram": None if device is None else bool(footprint <= device),
                "fits_with_params": None if device is None else bool(footprint + 2 * graph.param_bytes <= device),
            })
    return pd.DataFrame(rows)


def feasibility_metrics(feasible: pd.DataFrame, ratios: pd.DataFrame) -> dict[str, object]:
    return {
        "n_rows": int(len(feasible)),
        "all_verified": bool(feasible.verified_by_schedule.all()),
        "min_train_ram_bytes": {r.model: int(r.min_train_ram_bytes) for r in feasible.drop_duplicates("model").itertuples()},
        "fits_device_ram": {f"{r.model}/{r.platform}": r.fits_device_ram for r in feasible.itertuples()},
        "train_vs_inference": {r.model: float(r.train_vs_inference) for r in ratios.itertuples()},
    }

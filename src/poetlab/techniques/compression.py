"""Compression as a fourth choice of the POET MILP, and sparse update as a graph transformation.

References: S. G. Patil et al., *POET*, ICML 2022 (the MILP: keep, recompute or page each tensor);
A. Hosny et al., *Sparse Bitmap Compression for Memory-Efficient Training on the Edge* (BitTrain), SEC
2021 (the bitmap format, :mod:`poetlab.techniques.bittrain`); J. Lin et al., *On-Device Training Under
256KB Memory*, NeurIPS 2022 (sparse update). No published tool combines compression with remat and
paging; this is our extension, not a reproduction.

- :func:`compression_costs`: per node, whether its output may be kept compressed (a forward ReLU or
  max-pool output whose profiled density, raised by a safety margin, is below BitTrain's break-even
  density), its compressed size (bitmap + non-zeros at the margined density, so the plan holds when a
  batch is a little denser than the profile) and the time and energy to compress and decompress it,
  charged as ``flop_per_element`` flop-equivalents per element on the platform's flop model.
- :func:`measure_densities`: the densities of a real PyTorch model's ReLU and max-pool outputs, in
  forward order, from forward hooks on one batch; :func:`densities_for_graph` maps them onto a paper
  graph's nodes of the same kinds (one to one when the counts agree, as for VGG-16, else by relative
  depth).
- The graph transformations that go with it live in :mod:`poetlab.techniques.transforms`.

The MILP side is :class:`poetlab.milp.MilpOptions` (``compression=True``) and ``poetlab.solve(...,
compression=True)``; every schedule goes through :func:`poetlab.simulate`, which knows the compress,
decompress and compressed-free operations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from poetlab.costs import CompressionCosts
from poetlab.errors import InvalidArgumentError
from poetlab.graph import TrainingGraph
from poetlab.platforms import Platform
from poetlab.techniques.bittrain import break_even_density, compressed_bytes

#: node kinds whose outputs are sparse (ReLU zeros, and max-pools of ReLU outputs)
SPARSE_KINDS = ("relu", "maxpool2d")
#: flop-equivalents charged per element to compress (read, compare, pack a bit, copy a non-zero) and
#: to decompress (unpack a bit, scatter); an estimate, compared with a measured host ratio in
#: benchmarks/bench_techniques.py
FLOP_PER_ELEMENT = 8.0


def compression_costs(
    graph: TrainingGraph,
    platform: Platform,
    densities: Mapping[int, float],
    margin: float = 0.1,
    flop_per_element: float = FLOP_PER_ELEMENT,
    bytes_per_element: int = 4,
) -> CompressionCosts:
    """Compression costs of ``graph``'s nodes on ``platform`` from profiled ``densities`` (node index ->
    fraction of non-zeros). A node may be compressed when it is a forward node with a density and
    ``density * (1 + margin)`` is below the break-even density; its size is computed at that density."""
    if not (math.isfinite(margin) and margin >= 0):
        raise InvalidArgumentError(f"safety margin must be a non-negative fraction, got {margin!r}")
    if not (math.isfinite(flop_per_element) and flop_per_element >= 0):
        raise InvalidArgumentError(f"flop per element must be non-negative, got {flop_per_element!r}")
    T = graph.n_nodes
    allowed = np.zeros(T, dtype=bool)
    size = graph.output_bytes.copy()
    limit = break_even_density(bytes_per_element)
    for index, density in densities.items():
        if not 0 <= index < T:
            raise InvalidArgumentError(f"density given for node {index}, but the graph has {T} nodes")
        if not 0.0 <= density <= 1.0:
            raise InvalidArgumentError(f"density of node {index} must be in [0, 1], got {density!r}")
        node = graph.nodes[index]
        margined = min(1.0, density * (1.0 + margin))
        numel = node.output_bytes // bytes_per_element
        if node.is_backward or margined >= limit or numel == 0:
            continue
        candidate = compressed_bytes(numel, margined, bytes_per_element)
        if candidate < node.output_bytes:
            allowed[index] = True
            size[index] = candidate
    elements = graph.output_bytes / bytes_per_element
    flop = np.where(allowed, flop_per_element * elements, 0.0)
    time_s = flop / platform.flops_per_s
    energy_j = flop / platform.flop_per_j
    return CompressionCosts(allowed, size, time_s, energy_j, time_s, energy_j)


def measure_densities(module: nn.Module, inputs: torch.Tensor, kinds: Sequence[type[nn.Module]] = (nn.ReLU, nn.ReLU6, nn.MaxPool2d)) -> dict[str, list[float]]:
    """Fraction of non-zeros in the output of every module of ``kinds``, in forward order, grouped by
    the paper graph's kind names (``relu``, ``maxpool2d``), from one forward pass in train mode."""
    found: dict[str, list[float]] = {"relu": [], "maxpool2d": []}
    hooks = []

    def hook(layer, _inputs, output):
        kind = "maxpool2d" if isinstance(layer, nn.MaxPool2d) else "relu"
        found[kind].append(float(torch.count_nonzero(output)) / output.numel())

    for layer in module.modules():
        if isinstance(layer, tuple(kinds)):
            hooks.append(layer.register_forward_hook(hook))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module(inputs)
    finally:
        for handle in hooks:
            handle.remove()
    return found


def densities_for_graph(graph: TrainingGraph, measured: Mapping[str, Sequence[float]]) -> dict[int, float]:
    """Assign measured densities to the graph's forward nodes of the same kind, in order: one to one
    when the counts agree, otherwise the node at relative depth q gets the measurement at relative
    depth q (nearest)."""
    out: dict[int, float] = {}
    for kind, values in measured.items():
        nodes = [i for i, node in enumerate(graph.nodes) if node.kind == kind and not node.is_backward]
        if not nodes or not values:
            continue
        for rank, index in enumerate(nodes):
            if len(values) == len(nodes):
                out[index] = float(values[rank])
            else:
                position = 0 if len(nodes) == 1 else rank / (len(nodes) - 1)
                out[index] = float(values[round(position * (len(values) - 1))])
    return out


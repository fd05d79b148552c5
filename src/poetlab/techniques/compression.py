"""Compression as a fourth choice of the POET MILP, and sparse update as a graph transformation.

References: S. G. Patil et al., *POET*, ICML 2022 (the MILP: keep, recompute or page each tensor);
A. Hosny et al., *Sparse Bitmap Compression for Memory-Efficient Training on the Edge* (BitTrain), SEC
2021 (the bitmap format, :mod:`poetlab.techniques.bittrain`); J. Lin et al., *On-Device Training Under
256KB Memory*, NeurIPS 2022 (sparse update). No published tool combines compression with remat and
paging; this is our extension, not a reproduction.

- :func:`compression_costs`: per node, whether its output may be kept compressed (a forward node whose
  profiled density, raised by a safety margin, is below BitTrain's break-even density), its compressed
  size (bitmap + non-zeros at the margined density, so the plan holds when a batch is a little denser
  than the profile) and the time and energy to compress and decompress it. Two ways to cost them:
  *measured* (``rates``, a :class:`BitmapRates` from :func:`measure_bitmap_rates`: this host's time per
  element and per non-zero of :func:`poetlab.techniques.bittrain.compress` and ``decompress``, the very
  functions :mod:`poetlab.torch.execute` runs, at ``power_w``, the host profile's compute power), or, on a
  paper platform, the *estimate* of ``flop_per_element`` flop-equivalents per element on the platform's
  flop model (:data:`FLOP_PER_ELEMENT`; an estimate, not a measurement of that device).
- :func:`graph_densities`: densities of a traced graph (:mod:`poetlab.torch.trace`), one per forward node,
  keyed by node index, measured on the real module and batch: the non-zero fraction of exactly the bytes
  the node owns (output and internal saved tensors), which are the bytes a schedule compresses. Fused
  nodes (``Conv2d+BatchNorm2d+ReLU``: a dense convolution output beside a sparse ReLU output) get the
  density of the mix; no guessing by kind.
- :func:`measure_densities` + :func:`densities_for_graph` (paper graphs): the densities of a real PyTorch
  model's ReLU and max-pool outputs, in forward order, from forward hooks on one batch, mapped onto a
  paper graph's nodes of the same kinds (one to one when the counts agree, as for VGG-16, else by
  relative depth). A traced graph is refused there (its kinds are torch's class names, and a fused
  node's bytes are not one ReLU's output): use :func:`graph_densities`.
- The graph transformations that go with it live in :mod:`poetlab.techniques.transforms`; the schedules that
  keep idle outputs compressed (BitTrain's policy, a start for the MILP) in :mod:`poetlab.planners.compression`.

The MILP side is :class:`poetlab.planners.poet.milp.MilpOptions` (``compression=True``) and ``poetlab.solve(...,
compression=True)``; every schedule goes through :func:`poetlab.simulate`, which knows the compress,
decompress and compressed-free operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from poetlab.core.costs import CompressionCosts
from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import TrainingGraph
from poetlab.core.platforms import Platform
from poetlab.techniques.bittrain import break_even_density, compress, compressed_bytes, decompress

#: node kinds whose outputs are sparse (ReLU zeros, and max-pools of ReLU outputs)
SPARSE_KINDS = ("relu", "maxpool2d")
#: the same in a traced graph (torch's class names; a fused node's kind ends with its last member's)
TRACED_SPARSE_KINDS = ("ReLU", "ReLU6", "MaxPool2d")
#: flop-equivalents charged per element to compress (read, compare, pack a bit, copy a non-zero) and
#: to decompress (unpack a bit, scatter) on a paper platform's flop model: an ESTIMATE (no such device
#: was measured); on this host use measured :class:`BitmapRates` instead
FLOP_PER_ELEMENT = 8.0


@dataclass(frozen=True)
class BitmapRates:
    """Measured cost of the bitmap format on this host: the median time per element of compress and of
    decompress at each of ``densities``, on float32 tensors of ``numel`` elements with ``threads`` torch
    threads on ``clock``. Between measured densities the time is interpolated linearly (clamped at the
    ends): it is not linear in the density (masked copies cost most near one half, where the branch
    predictor does worst), so no line is fitted through it."""

    densities: tuple[float, ...]
    compress_s_per_element: tuple[float, ...]
    decompress_s_per_element: tuple[float, ...]
    numel: int
    threads: int
    clock: str

    def compress_time_s(self, numel: np.ndarray, density: np.ndarray) -> np.ndarray:
        return numel * np.interp(density, self.densities, self.compress_s_per_element)

    def decompress_time_s(self, numel: np.ndarray, density: np.ndarray) -> np.ndarray:
        return numel * np.interp(density, self.densities, self.decompress_s_per_element)


def measure_bitmap_rates(
    numel: int = 1 << 18, densities: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9, 0.97), repeats: int = 5, warmup: int = 1, clock: str = "cpu", seed: int = 0,
) -> BitmapRates:
    """Time :func:`~poetlab.techniques.bittrain.compress` and ``decompress`` (what the executor runs) on
    seeded float32 tensors of ``numel`` elements at each density (median of ``repeats`` after
    ``warmup``), with torch's current thread count. ``clock`` is ``cpu`` (this thread's CPU time: steady
    on a shared machine; needs one torch thread, as the host profile's node times) or ``wall``."""
    from poetlab.torch.profile import CLOCKS, median_time

    if clock not in CLOCKS or (clock == "cpu" and torch.get_num_threads() != 1):
        raise InvalidArgumentError(f"clock must be one of {', '.join(CLOCKS)} (cpu only with one torch thread), got {clock!r}")
    if numel < 1024 or repeats < 1 or warmup < 0 or not densities or list(densities) != sorted(set(densities)) or not all(0.0 <= d <= 1.0 for d in densities):
        raise InvalidArgumentError("measure_bitmap_rates needs numel >= 1024, repeats >= 1, warm-up >= 0 and increasing densities in [0, 1]")
    generator = torch.Generator().manual_seed(seed)

    def median(run: Callable[[], object]) -> float:
        return median_time(lambda _: run(), repeats, warmup, clock=clock)[0] / numel

    pack, unpack = [], []
    for density in densities:
        values = torch.rand(numel, generator=generator) + 0.5
        tensor = torch.where(torch.rand(numel, generator=generator) < density, values, torch.zeros(()))
        packed = compress(tensor)
        pack.append(median(lambda: compress(tensor)))
        unpack.append(median(lambda: decompress(packed)))
    return BitmapRates(tuple(float(d) for d in densities), tuple(pack), tuple(unpack), numel, torch.get_num_threads(), clock)


def compression_costs(
    graph: TrainingGraph,
    platform: Platform,
    densities: Mapping[int, float],
    margin: float = 0.1,
    flop_per_element: float = FLOP_PER_ELEMENT,
    bytes_per_element: int = 4,
    *,
    rates: BitmapRates | None = None,
    power_w: float | None = None,
) -> CompressionCosts:
    """Compression costs of ``graph``'s nodes on ``platform`` from profiled ``densities`` (node index ->
    fraction of non-zeros). A node may be compressed when it is a forward node with a density and
    ``density * (1 + margin)`` is below the break-even density; its size is computed at that density.

    Time and energy: with measured ``rates`` (this host), the fitted time at the margined density, and
    that time at ``power_w`` (default: the platform's compute power, which for ``HostProfile.platform()``
    is the profile's); without, ``flop_per_element`` flop-equivalents per element on the platform's flop
    model (an estimate)."""
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
    if rates is None:
        flop = np.where(allowed, flop_per_element * elements, 0.0)
        time_s = flop / platform.flops_per_s
        energy_j = flop / platform.flop_per_j
        return CompressionCosts(allowed, size, time_s, energy_j, time_s, energy_j)
    power = platform.compute_power_w if power_w is None else power_w
    if not (power is not None and math.isfinite(power) and power > 0):
        raise InvalidArgumentError(f"measured compression rates need a positive compute power in watts, got {power!r}")
    margined = np.ones(T)
    for index, density in densities.items():
        margined[index] = min(1.0, density * (1.0 + margin))
    pack_s = np.where(allowed, rates.compress_time_s(elements, margined), 0.0)
    unpack_s = np.where(allowed, rates.decompress_time_s(elements, margined), 0.0)
    return CompressionCosts(allowed, size, pack_s, pack_s * power, unpack_s, unpack_s * power)


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


def graph_densities(
    module: nn.Module, example_inputs: torch.Tensor | Sequence[torch.Tensor], loss_fn: Callable[..., torch.Tensor], targets: object, graph: TrainingGraph,
) -> dict[int, float]:
    """Densities of traced ``graph``'s forward nodes (index -> fraction of non-zero 4-byte words of the
    bytes the node owns), measured in one real training step of ``module`` on ``example_inputs`` (the
    batch may differ from the one traced; the module is left as it was). ``graph`` must come from
    :func:`poetlab.torch.trace` of this module, fused or not as it was traced."""
    from poetlab.torch.trace import trace_step

    if graph.metadata.get("source") != "poetlab.torch.trace":
        raise InvalidArgumentError(f"{graph.name} is not a traced graph; for a paper graph use densities_for_graph(graph, measure_densities(module, inputs))")
    traced = trace_step(module, example_inputs, loss_fn, targets, fuse=bool(graph.metadata.get("fused")), name=graph.name)
    if tuple(n.name for n in traced.graph.nodes) != tuple(n.name for n in graph.nodes):
        raise InvalidArgumentError(f"{graph.name} was not traced from this module (its nodes differ from a fresh trace); trace it again")
    return traced.node_densities()


def densities_for_graph(graph: TrainingGraph, measured: Mapping[str, Sequence[float]]) -> dict[int, float]:
    """Assign measured densities to a paper graph's forward nodes of the same kind, in order: one to one
    when the counts agree, otherwise the node at relative depth q gets the measurement at relative
    depth q (nearest). Traced graphs are refused: :func:`graph_densities` measures them node by node."""
    if graph.metadata.get("source") == "poetlab.torch.trace":
        raise InvalidArgumentError(f"{graph.name} is a traced graph: measure its densities node by node with graph_densities(module, inputs, loss_fn, targets, graph)")
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


"""Per-node costs of a training graph on a platform.

The paper's cost model is a flop model: a node's runtime is ``flop / flops_per_s``, its compute energy
``flop / flop_per_j``, and moving its output to or from flash costs ``latency + bytes / throughput``
seconds at the platform's memory power. Planners read only this :class:`CostModel`, so a profiled
cost model (measured per-node times) can stand in for the flop model without touching them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import TrainingGraph
from poetlab.core.platforms import Platform

if TYPE_CHECKING:
    from poetlab.torch.host_profile import HostProfile


@dataclass(frozen=True, eq=False)
class CompressionCosts:
    """What keeping each node's output compressed costs (the fourth choice beside keep, recompute and
    page; see :mod:`poetlab.techniques.compression`). Arrays indexed like the graph's nodes:
    ``allowed`` says which outputs may be compressed, ``compressed_bytes`` their size once compressed
    (a safety margin already included), and the time and energy of compressing and decompressing."""

    allowed: np.ndarray
    compressed_bytes: np.ndarray
    compress_time_s: np.ndarray
    compress_energy_j: np.ndarray
    decompress_time_s: np.ndarray
    decompress_energy_j: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", _readonly(np.array(self.allowed, dtype=bool)))
        object.__setattr__(self, "compressed_bytes", _readonly(np.array(self.compressed_bytes, dtype=np.int64)))
        sizes = {self.allowed.shape[0], self.compressed_bytes.shape[0]}
        for name in ("compress_time_s", "compress_energy_j", "decompress_time_s", "decompress_energy_j"):
            array = np.array(getattr(self, name), dtype=np.float64)
            if array.ndim != 1 or not np.all(np.isfinite(array)) or np.any(array < 0):
                raise ValueError(f"compression cost array {name} must be one-dimensional, finite and non-negative")
            object.__setattr__(self, name, _readonly(array))
            sizes.add(array.shape[0])
        if len(sizes) != 1 or np.any(self.compressed_bytes < 0):
            raise ValueError("compression cost arrays must have one non-negative entry per node")


@dataclass(frozen=True, eq=False)
class CostModel:
    """Per-node costs, each a read-only float64 array indexed like the graph's nodes; ``compression``
    (optional) the costs of keeping outputs compressed.

    ``recompute_runtime_s`` and ``recompute_energy_j`` price a node's second and later computes (a
    rerun); left out, they are its first compute's, as in the paper's flop model. A profiled host
    prices them apart (:meth:`from_profile`): a rerun in the backward pass finds its inputs and weights
    evicted from the caches by the operations since, and builds an autograd graph whose saved tensors the
    executor collects (on this machine's CPU, nodes of a millisecond or more reran in 1.0-1.9 times their
    time alone, the smallest in up to 12 times)."""

    platform: str
    runtime_s: np.ndarray
    compute_energy_j: np.ndarray
    pagein_time_s: np.ndarray
    pageout_time_s: np.ndarray
    pagein_energy_j: np.ndarray
    pageout_energy_j: np.ndarray
    compression: CompressionCosts | None = None
    recompute_runtime_s: np.ndarray | None = None
    recompute_energy_j: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.recompute_runtime_s is None:
            object.__setattr__(self, "recompute_runtime_s", self.runtime_s)
        if self.recompute_energy_j is None:
            object.__setattr__(self, "recompute_energy_j", self.compute_energy_j)
        if not isinstance(self.platform, str):
            raise InvalidArgumentError(f"CostModel: platform must be a platform name (text), got {type(self.platform).__name__}")
        if self.compression is not None and not isinstance(self.compression, CompressionCosts):
            raise InvalidArgumentError(f"CostModel: compression must be CompressionCosts or None, got {type(self.compression).__name__}")
        sizes = set()
        for name in _ARRAYS:
            try:
                array = np.array(getattr(self, name), dtype=np.float64)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"CostModel: cost array {name} must be a sequence of numbers, got {type(getattr(self, name)).__name__}") from None
            if array.ndim != 1 or not np.all(np.isfinite(array)) or np.any(array < 0):
                raise InvalidArgumentError(f"CostModel: cost array {name} must be one-dimensional, finite and non-negative")
            array.setflags(write=False)
            object.__setattr__(self, name, array)
            sizes.add(array.shape[0])
        if len(sizes) != 1:
            raise InvalidArgumentError("CostModel: all cost arrays must have one entry per node")
        if self.compression is not None and self.compression.allowed.shape[0] not in sizes:
            raise InvalidArgumentError("CostModel: compression costs must have one entry per node")

    def with_compression(self, compression: CompressionCosts | None) -> CostModel:
        """The same costs with ``compression`` (None: without)."""
        return replace(self, compression=compression)

    @property
    def n_nodes(self) -> int:
        return int(self.runtime_s.shape[0])

    @property
    def plain_step_runtime_s(self) -> float:
        """Runtime of one step that computes every node once, with no recomputation or paging."""
        return float(self.runtime_s.sum())

    @property
    def plain_step_energy_j(self) -> float:
        """Compute energy of one step that computes every node once."""
        return float(self.compute_energy_j.sum())

    def computes_runtime_s(self, R: np.ndarray) -> float:
        """Compute time of the computes in matrix ``R`` (stage x node, true where the stage computes
        the node): a node's own stage (the diagonal) is its first compute, any other a rerun."""
        R = np.asarray(R, dtype=bool)
        diagonal = np.eye(R.shape[0], R.shape[1], dtype=bool)
        return float(self.runtime_s[np.nonzero(R & diagonal)[1]].sum() + self.recompute_runtime_s[np.nonzero(R & ~diagonal)[1]].sum())

    @classmethod
    def from_flops(cls, graph: TrainingGraph, platform: Platform) -> CostModel:
        """The paper's flop cost model of ``graph`` on ``platform``."""
        _check_type("CostModel.from_flops", "graph", graph, TrainingGraph)
        _check_type("CostModel.from_flops", "platform", platform, Platform)
        flop = graph.flop
        return cls._with_paging(graph, platform, flop / platform.flops_per_s, flop / platform.flop_per_j)

    @classmethod
    def from_profile(cls, graph: TrainingGraph, profile: HostProfile, *, calibrate: bool = True) -> CostModel:
        """Measured costs on the profiled host: each node's runtime and compute energy as profiled (RAPL, or
        the profile's power model), paging from its disk fit. The profile must have timed this very graph
        (same node names, e.g. the same traced model with the same fusion); otherwise cost the graph by
        flops on the host: ``CostModel.from_flops(graph, profile.platform())``.

        ``calibrate`` (the default) scales the forward nodes' times and energies by one factor, the
        profile's measured forward pass of a whole step over the sum of their probed times, and the
        backward nodes' by another (the rest of the step over theirs), so that the simulator's plain step
        is the step the profile measured (one factor for all nodes with an older profile that did not time
        the forward pass). Why: a node timed alone, over and over, misses what a real step spends between
        and around nodes (autograd's engine, the allocator, Python's module calls, colder caches); on this
        machine the probed forward nodes were up to 20% below their time inside a step while backward
        nodes were closer, and that gap, not the schedule, dominated the error of predicted against
        executed step times (benchmarks/bench_execute.py). ``calibrate=False`` gives the node times
        exactly as probed.

        A rerun is priced at its time as the profile measured it, rerun as the executor reruns it in the
        middle of a backward pass of a whole step (``NodeTiming.rerun_s``: :func:`poetlab.torch.profile.rerun_samples`),
        as it is: it was timed inside a step, so there is nothing to calibrate; its energy at the node's
        probed power (``energy_j / runtime_s``). Where the profile did not time it, a rerun costs the node's
        (calibrated) compute."""
        _check_type("CostModel.from_profile", "graph", graph, TrainingGraph)
        if not hasattr(profile, "model") or not hasattr(profile, "platform"):
            raise InvalidArgumentError(f"CostModel.from_profile: profile must be a HostProfile, got {type(profile).__name__}")
        timed = profile.model
        names = tuple(node.name for node in graph.nodes)
        if timed is None or tuple(node.name for node in timed.nodes) != names:
            what = "no model" if timed is None else f"{timed.name} ({len(timed.nodes)} nodes{', fused' if timed.fused else ''})"
            raise InvalidArgumentError(
                f"the host profile has per-node timings for {what}, not for {graph.name} ({graph.n_nodes} nodes); "
                f"run `poetlab profile --platform host --model {graph.name}` or cost it by flops with CostModel.from_flops(graph, profile.platform())"
            )
        runtime = np.array([node.runtime_s for node in timed.nodes], dtype=np.float64)
        energy = np.array([node.energy_j for node in timed.nodes], dtype=np.float64)
        probed = np.array([node.rerun_s is not None for node in timed.nodes])
        rerun = np.array([node.runtime_s if node.rerun_s is None else node.rerun_s for node in timed.nodes], dtype=np.float64)
        rerun_energy = energy * np.divide(rerun, runtime, out=np.ones_like(runtime), where=runtime > 0)
        if calibrate:
            factor = _calibration(graph, runtime, timed.step_runtime_s, timed.forward_runtime_s)
            runtime, energy = runtime * factor, energy * factor
        costs = cls._with_paging(graph, profile.platform(), runtime, energy)
        return replace(
            costs,
            recompute_runtime_s=np.where(probed, rerun, runtime),
            recompute_energy_j=np.where(probed, rerun_energy, energy),
        )

    @classmethod
    def _with_paging(cls, graph: TrainingGraph, platform: Platform, runtime_s: np.ndarray, energy_j: np.ndarray) -> CostModel:
        """Compute costs as given; paging as latency + bytes / throughput at the platform's memory power."""
        nbytes = graph.output_bytes.astype(np.float64)
        pagein_time = platform.pagein_latency_s + nbytes / platform.pagein_throughput_bytes_per_s
        pageout_time = platform.pageout_latency_s + nbytes / platform.pageout_throughput_bytes_per_s
        return cls(
            platform=platform.name,
            runtime_s=runtime_s,
            compute_energy_j=energy_j,
            pagein_time_s=pagein_time,
            pageout_time_s=pageout_time,
            pagein_energy_j=pagein_time * platform.memory_power_w,
            pageout_energy_j=pageout_time * platform.memory_power_w,
        )


_ARRAYS = ("runtime_s", "compute_energy_j", "pagein_time_s", "pageout_time_s", "pagein_energy_j", "pageout_energy_j", "recompute_runtime_s", "recompute_energy_j")


def _calibration(graph: TrainingGraph, runtime_s: np.ndarray, step_s: float, forward_s: float | None) -> np.ndarray:
    """Per node, the factor that takes probed node times to their share of a measured whole step: one
    for the forward nodes (forward pass over their sum) and one for the backward nodes (the rest of the
    step over theirs) when the forward pass was timed and both parts are positive; else one factor."""
    backward = np.array([node.is_backward for node in graph.nodes], dtype=bool)
    forward_sum, backward_sum = float(runtime_s[~backward].sum()), float(runtime_s[backward].sum())
    if forward_s is not None and 0 < forward_s < step_s and forward_sum > 0 and backward_sum > 0:
        return np.where(backward, (step_s - forward_s) / backward_sum, forward_s / forward_sum)
    total = float(runtime_s.sum())
    return np.full(runtime_s.shape, step_s / total if step_s > 0 and total > 0 else 1.0)


def _check_type(function: str, argument: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise InvalidArgumentError(f"{function}: {argument} must be a {kind.__name__}, got {type(value).__name__}")


def check_graph_and_costs(function: str, graph: object, costs: object) -> None:
    """InvalidArgumentError (one line) unless ``graph`` is a TrainingGraph and ``costs`` a CostModel of as
    many nodes: what the public entry points taking both (solve, simulate) check first, so that costs
    made for another graph give this line and not a numpy broadcast error."""
    _check_type(function, "graph", graph, TrainingGraph)
    _check_type(function, "costs", costs, CostModel)
    if costs.n_nodes != graph.n_nodes:  # type: ignore[attr-defined]
        raise InvalidArgumentError(
            f"{function}: the costs have {costs.n_nodes} nodes but graph {graph.name!r} has {graph.n_nodes}; "  # type: ignore[attr-defined]
            "make the costs from this graph (CostModel.from_flops(graph, platform))"
        )


def check_number(function: str, argument: str, value: object, low: float, high: float = math.inf, *, optional: bool = False) -> None:
    """InvalidArgumentError (one line) unless ``value`` is a real number (not a bool), finite, in [low, high]."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and low <= value <= high):
        valid = f"a finite number >= {low:g}" if high == math.inf else f"a finite number from {low:g} to {high:g}"
        raise InvalidArgumentError(f"{function}: {argument} must be {valid}{' or None' if optional else ''}, got {value!r}")


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array

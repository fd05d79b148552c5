"""The ``host`` platform, measured: per-node runtimes of a traced model, paging to a real file, power.

The paper platforms are coefficient files; ``host`` is whatever machine this runs on, so it is measured:

- **Nodes**: each node of a traced training graph (:mod:`poetlab.torch.trace`) runs alone on its recorded
  inputs: a forward node's forward, a backward node's backward (its forward rerun untimed before each
  repeat), ``warmup`` runs then the median of ``repeats``, with torch's intra-op threads pinned to
  ``threads`` (recorded). With one thread the clock is the thread's CPU time (``clock: cpu``): on a
  shared machine wall time also counts the time spent waiting for a core, which inflates long runs (a
  whole step) far more than short ones (a node) and made their ratio meaningless under load. One whole plain training step (forward, loss, backward) is timed the same way,
  so that the sum of node times can be checked against it (``step_runtime_s``). Each forward node is
  also timed rerun where a schedule reruns it, in the middle of the backward pass of a whole step, as the
  executor reruns it (grad on, what autograd saves collected; ``rerun_s``): the cost model prices
  recomputes by it (:meth:`poetlab.core.costs.CostModel.from_profile`).
- **Flop rate**: a float32 matmul benchmark, so that a graph without per-node timings (a paper model, or
  another traced model) can still be costed on the host by its flops.
- **Paging**: page-outs and page-ins of the executor's own :class:`~poetlab.torch.paging.PageStore`, in a
  private directory under ``paging_dir``: ``write`` + ``fsync`` of the page's file with its cached pages
  then dropped (``posix_fadvise(DONTNEED)``), and a read of it back from the disk (``cache_bypass`` says
  how the page cache was kept out). The very code a schedule's paging runs, so that the prediction prices
  what the executor does: a read through ``O_DIRECT`` takes less than the
  executor's buffered read. Latency and throughput come from a least-squares line
  ``t = latency + bytes / throughput`` over several sizes (median of repeats per size).
- **Energy**: from RAPL (``/sys/class/powercap/intel-rapl:*/energy_uj``, package domains) where readable:
  each node's energy is the counter's difference over its timed repeats, and paging power is the mean
  power over the disk benchmark. Where RAPL cannot be read (containers, AMD without the driver, no
  permission) a documented power model is used and every energy is marked ``modeled``:
  compute power = ``threads x`` :data:`MODEL_CORE_POWER_W`, paging power = :data:`MODEL_MEMORY_POWER_W`.

The profile is one JSON file (written atomically) with the machine's description (CPU model, cores,
torch version and threads, date) beside the numbers; :meth:`HostProfile.platform` turns it into a
:class:`~poetlab.core.platforms.Platform` and :meth:`poetlab.core.costs.CostModel.from_profile` into per-node costs.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform as _platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from poetlab.core.files import read_text_or_raise, write_text_atomic
from poetlab.core.data import data_dir
from poetlab.errors import InvalidArgumentError, OutputError, PoetlabError
from poetlab.torch.paging import PageStore, PagingError
from poetlab.core.platforms import Platform
from poetlab.torch.kernels import CONVOLUTION_KERNELS, cpu_capability, planned_kernels

log = logging.getLogger("poetlab.profile")

PROFILE_FORMAT_VERSION = 2
#: versions still read: version 1's rerun times were taken another way (under the backward pass's grad mode,
#: off, interpreted), which the cost model no longer prices by: read without them (reruns priced as computes)
_READABLE_VERSIONS = (1, PROFILE_FORMAT_VERSION)
#: the rerun probe reruns every RERUN_STRIDE-th forward node in a step, each in turn: a schedule reruns a few
#: nodes, and rerunning all of them in every probed step overprices them (docs/benchmarks.md)
RERUN_STRIDE = 4
#: Modeled compute power per busy core: the per-core share of an AMD EPYC 7763's 280 W TDP over its 64
#: cores (AMD data sheet). An assumption for a shared server core, used only where RAPL cannot be read.
MODEL_CORE_POWER_W = 280.0 / 64
#: Modeled paging power: the active power of a typical data-centre NVMe SSD (order of magnitude of data
#: sheets, 3-8 W when writing), used only where RAPL cannot be read.
MODEL_MEMORY_POWER_W = 5.0
#: Default page sizes of the disk benchmark: 64 KiB to 16 MiB, multiples of 4 KiB for O_DIRECT.
DEFAULT_DISK_SIZES_BYTES: tuple[int, ...] = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
RAPL_ROOT = Path("/sys/class/powercap")


class ProfileFileError(PoetlabError, ValueError):
    """A host profile JSON file that is missing, unreadable or does not follow the format."""


class PagingDirError(OutputError):
    """A paging directory that does not exist, is not writable, or has too little space."""


# ---- the profile ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    logical_cores: int
    torch_threads: int
    torch_version: str
    python_version: str
    os: str
    date: str
    # the instruction set torch's CPU kernels were dispatched for, and the convolution kernels the model
    # was timed on (NOTE [kernel choice] in poetlab.torch.kernels); None in profiles taken before they were recorded
    cpu_capability: str | None = None
    convolution_kernels: str | None = None

    @classmethod
    def here(cls, threads: int) -> MachineInfo:
        return cls(
            cpu_model=_cpu_model(), logical_cores=os.cpu_count() or 1, torch_threads=threads,
            torch_version=torch.__version__, python_version=_platform.python_version(),
            os=f"{_platform.system()} {_platform.release()}", date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            cpu_capability=cpu_capability(), convolution_kernels=CONVOLUTION_KERNELS,
        )


@dataclass(frozen=True)
class DiskProfile:
    """Page-out (write + fsync) and page-in (uncached read) of a real file by :class:`~poetlab.torch.paging.PageStore`,
    fitted as latency + size/throughput."""

    directory: str
    cache_bypass: str
    sizes_bytes: tuple[int, ...]
    pageout_s: tuple[float, ...]  # median per size
    pagein_s: tuple[float, ...]
    pageout_latency_s: float
    pageout_throughput_bytes_per_s: float
    pagein_latency_s: float
    pagein_throughput_bytes_per_s: float
    power_w: float
    energy_source: str  # "rapl" or "model"


@dataclass(frozen=True)
class NodeTiming:
    """One node's probed time (median of ``samples_s``) and energy; for a forward node, also its time
    when rerun in the middle of a backward pass (``rerun_s``, median of ``rerun_samples_s``; None where
    it was not timed: older profiles, inputs, the loss, an output autograd does not differentiate)."""

    name: str
    runtime_s: float
    energy_j: float
    samples_s: tuple[float, ...] = ()
    rerun_s: float | None = None
    rerun_samples_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelProfile:
    """Per-node measurements of one traced model (graph node names in graph order)."""

    name: str
    batch_size: int
    fused: bool
    nodes: tuple[NodeTiming, ...]
    step_runtime_s: float
    step_samples_s: tuple[float, ...] = ()
    forward_runtime_s: float | None = None  # the forward pass of a whole step (median), None in older profiles

    @property
    def node_runtime_sum_s(self) -> float:
        return float(sum(node.runtime_s for node in self.nodes))


@dataclass(frozen=True)
class HostProfile:
    machine: MachineInfo
    flops_per_s: float
    compute_power_w: float
    energy_source: str  # "rapl" or "model": where every energy figure in this profile comes from
    disk: DiskProfile
    repeats: int
    warmup: int
    model: ModelProfile | None = None
    notes: tuple[str, ...] = field(default=())
    clock: str = "wall"  # how node and step times were taken (see CLOCKS); paging is always wall time

    @property
    def energy_modeled(self) -> bool:
        return self.energy_source != "rapl"

    def platform(self, name: str = "host") -> Platform:
        """The host as a flop-model platform (measured matmul rate, measured paging, power as profiled)."""
        d = self.disk
        return Platform(
            name=name,
            description=f"this machine: {self.machine.cpu_model}, {self.machine.torch_threads} torch threads, profiled {self.machine.date}"
            + (" (energies modeled)" if self.energy_modeled else " (energies from RAPL)"),
            flops_per_s=self.flops_per_s,
            flop_per_j=self.flops_per_s / self.compute_power_w,
            pagein_latency_s=max(d.pagein_latency_s, 1e-9),
            pagein_throughput_bytes_per_s=d.pagein_throughput_bytes_per_s,
            pageout_latency_s=max(d.pageout_latency_s, 1e-9),
            pageout_throughput_bytes_per_s=d.pageout_throughput_bytes_per_s,
            memory_power_w=d.power_w,
            compute_power_w=self.compute_power_w,
            sources=self._sources(),
        )

    def _sources(self) -> dict[str, str]:
        """Where each coefficient comes from, in the words Table 2 prints beside it."""
        m = self.machine
        where = f"{m.cpu_model}, {m.torch_threads} torch threads, {m.date}"
        compute = f"profiled: float32 matmul benchmark by `poetlab profile` on {where}"
        paging = f"profiled: write + fsync, reads with {self.disk.cache_bypass}, least-squares fit over sizes, in {self.disk.directory}"
        power = (
            f"modeled (RAPL unreadable): compute {self.compute_power_w:g} W, paging {self.disk.power_w:g} W (poetlab.torch.profile's power model)"
            if self.energy_modeled else f"profiled: RAPL package energy counters on {where}"
        )
        paging_keys = ("pagein_latency_s", "pagein_throughput_bytes_per_s", "pageout_latency_s", "pageout_throughput_bytes_per_s")
        return {"flops_per_s": compute, "flop_per_j": f"{compute}; power {power}", **dict.fromkeys(paging_keys, paging),
                "memory_power_w": power, "compute_power_w": power}

    # ---- JSON ----
    def to_dict(self) -> dict[str, object]:
        return {"format": "poetlab.HostProfile", "version": PROFILE_FORMAT_VERSION, **asdict(self)}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON, atomically."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: object, origin: str = "profile") -> HostProfile:
        if not isinstance(data, dict) or data.get("format") != "poetlab.HostProfile":
            raise ProfileFileError(f"{origin}: not a poetlab host profile (missing format: poetlab.HostProfile); run `poetlab profile --platform host`")
        if data.get("version") not in _READABLE_VERSIONS:
            raise ProfileFileError(f"{origin}: host profile version {data.get('version')!r} is not supported (expected {PROFILE_FORMAT_VERSION}); re-run `poetlab profile`")
        reruns = data.get("version") == PROFILE_FORMAT_VERSION
        try:
            model = data.get("model")
            profile = cls(
                machine=MachineInfo(**data["machine"]),
                flops_per_s=float(data["flops_per_s"]),
                compute_power_w=float(data["compute_power_w"]),
                energy_source=str(data["energy_source"]),
                disk=_disk_from(data["disk"]),
                repeats=int(data["repeats"]),
                warmup=int(data["warmup"]),
                model=None if model is None else ModelProfile(
                    name=str(model["name"]), batch_size=int(model["batch_size"]), fused=bool(model["fused"]),
                    nodes=tuple(_node_timing(n, reruns) for n in model["nodes"]),
                    step_runtime_s=float(model["step_runtime_s"]), step_samples_s=tuple(model.get("step_samples_s", ())),
                    forward_runtime_s=None if model.get("forward_runtime_s") is None else float(model["forward_runtime_s"]),
                ),
                notes=tuple(data.get("notes", ())),
                clock=str(data.get("clock", "wall")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
            raise ProfileFileError(f"{origin}: invalid host profile: {detail}; re-run `poetlab profile`") from None
        values = [profile.flops_per_s, profile.compute_power_w, profile.disk.pagein_throughput_bytes_per_s, profile.disk.pageout_throughput_bytes_per_s, profile.disk.power_w]
        if not all(np.isfinite(v) and v > 0 for v in values) or (profile.model and any(not (n.runtime_s >= 0 and n.energy_j >= 0 and (n.rerun_s is None or n.rerun_s >= 0)) for n in profile.model.nodes)):
            raise ProfileFileError(f"{origin}: invalid host profile: rates, powers and times must be positive; re-run `poetlab profile`")
        return profile

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HostProfile:
        path = Path(path)
        missing = f"no such host profile; run `poetlab profile --platform host --output {path}`"
        text = read_text_or_raise(path, ProfileFileError, missing, "cannot read the host profile")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); re-run `poetlab profile`") from None
        return cls.from_dict(data, str(path))


def _node_timing(data: dict, reruns: bool = True) -> NodeTiming:
    rerun = data.get("rerun_s") if reruns else None
    return NodeTiming(
        str(data["name"]), float(data["runtime_s"]), float(data["energy_j"]), tuple(float(x) for x in data.get("samples_s", ())),
        None if rerun is None else float(rerun), tuple(float(x) for x in data.get("rerun_samples_s", ())) if reruns else (),
    )


def _disk_from(data: dict) -> DiskProfile:
    values = dict(data)
    for key in ("sizes_bytes", "pageout_s", "pagein_s"):
        values[key] = tuple(values[key])
    return DiskProfile(**values)


# ---- machine facts ----------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "unknown"


class Rapl:
    """Package energy counters of RAPL, summed over packages, with wrap-around; ``None`` when unreadable."""

    def __init__(self, files: list[tuple[Path, int]]):
        self.files = files

    @classmethod
    def open(cls, root: Path = RAPL_ROOT) -> Rapl | None:
        files = []
        for domain in sorted(root.glob("intel-rapl:*")):
            if domain.name.count(":") != 1:  # sub-domains (core, dram) are inside the package figure
                continue
            try:
                int((domain / "energy_uj").read_text())
                wrap = int((domain / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                continue
            files.append((domain / "energy_uj", wrap))
        return cls(files) if files else None

    def read_uj(self) -> list[int]:
        return [int(path.read_text()) for path, _ in self.files]

    def joules_since(self, start: list[int]) -> float:
        total = 0
        for (_, wrap), before, now in zip(self.files, start, self.read_uj(), strict=True):
            total += now - before if now >= before else now + wrap - before
        return total * 1e-6


# ---- timing helpers ---------------------------------------------------------------------------------


#: The clocks node timings can use: ``cpu`` is the calling thread's CPU time, which leaves out the time
#: spent waiting for a core on a shared machine (with one torch thread, all the work runs on the calling
#: thread, so it is the uncontended runtime); ``wall`` is elapsed time (needed with several threads).
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


def median_time(
    run: Callable[[object], None], repeats: int, warmup: int, prepare: Callable[[], object] | None = None, clock: str = "wall"
) -> tuple[float, tuple[float, ...]]:
    """Median time of ``run(prepared)`` on ``clock`` over ``repeats`` after ``warmup`` untimed calls."""
    now = CLOCKS[clock]
    samples = []
    for i in range(warmup + repeats):
        state = prepare() if prepare else None
        start = now()
        run(state)
        elapsed = now() - start
        if i >= warmup:
            samples.append(elapsed)
    return statistics.median(samples), tuple(samples)


def matmul_flops_per_s(threads: int, side: int = 512, repeats: int = 5, clock: str = "wall") -> float:
    """float32 matmul rate (2 n^3 flops per product) with the current torch threads (``threads``, recorded)."""
    a, b = torch.randn(side, side), torch.randn(side, side)
    seconds, _ = median_time(lambda _: torch.mm(a, b), repeats, 2, clock=clock)
    return 2.0 * side**3 / seconds


# ---- paging to a real file ----------------------------------------------------------------------------


def check_paging_dir(directory: str | os.PathLike[str], needed_bytes: int) -> Path:
    """``directory`` if it exists, is writable and has ``needed_bytes`` free; else one clear error."""
    path = Path(directory)
    if not path.is_dir():
        raise PagingDirError(f"paging directory {path} does not exist; create it or choose another with --paging-dir")
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".poetlab-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PagingDirError(f"paging directory {path} is not writable ({exc.strerror or exc}); choose another with --paging-dir") from None
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise PagingDirError(
            f"paging directory {path} has {free:,} bytes free, the disk benchmark needs {needed_bytes:,}; free some space or choose another with --paging-dir"
        )
    return path


def _fit(sizes: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(latency_s, throughput_bytes_per_s) of the least-squares line seconds = latency + size / throughput,
    both constrained non-negative (scipy's NNLS). When noise leaves no positive slope (fsync latency
    dominating small writes), the throughput is the largest size over its time: conservative."""
    from scipy.optimize import nnls

    sizes_f = np.asarray(sizes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    scale = sizes_f.max()
    (latency, slope), _ = nnls(np.column_stack([np.ones_like(sizes_f), sizes_f / scale]), times)
    if slope <= 0:
        log.warning("disk benchmark: time does not grow with size; throughput from the largest size alone")
        return float(latency) if latency < times[-1] else 0.0, float(sizes_f[-1] / times[-1])
    return float(latency), float(scale / slope)


def profile_disk(
    directory: str | os.PathLike[str],
    sizes_bytes: Sequence[int] = DEFAULT_DISK_SIZES_BYTES,
    repeats: int = 3,
    rapl: Rapl | None = None,
    memory_power_w: float = MODEL_MEMORY_POWER_W,
) -> DiskProfile:
    """Measure page-out and page-in to real files in ``directory`` (see the module docstring)."""
    sizes = tuple(int(s) for s in sizes_bytes)
    if len(sizes) < 2 or any(s <= 0 or s % 4096 for s in sizes):
        raise InvalidArgumentError("disk benchmark sizes must be at least two positive multiples of 4096 bytes")
    path = check_paging_dir(directory, needed_bytes=2 * max(sizes) + (16 << 20))
    outs, ins = [], []
    started, energy_start = time.perf_counter(), rapl.read_uj() if rapl else None
    try:
        with PageStore(path, durable=True) as store:
            for size in sizes:
                data = torch.from_numpy(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
                back = torch.empty(size, dtype=torch.uint8)
                out_s, in_s = [], []
                for _ in range(repeats + 1):  # the first of each size is a warm-up
                    t0 = time.perf_counter()
                    store.write("probe", [data.untyped_storage()])
                    t1 = time.perf_counter()
                    store.read_into("probe", [(0, back.untyped_storage())])
                    t2 = time.perf_counter()
                    out_s.append(t1 - t0)
                    in_s.append(t2 - t1)
                    if not torch.equal(back[:64], data[:64]):
                        raise PoetlabError(f"paging benchmark in {path}: the file read back differs from what was written")
                outs.append(statistics.median(out_s[1:]))
                ins.append(statistics.median(in_s[1:]))
            how = store.cache_bypass
    except PagingError as exc:  # (a full disk, the directory removed: the store's one line)
        raise PagingDirError(f"disk benchmark: {exc}") from None
    if rapl is not None:
        power, source = rapl.joules_since(energy_start) / (time.perf_counter() - started), "rapl"
    else:
        power, source = memory_power_w, "model"
    out_latency, out_rate = _fit(sizes, outs)
    in_latency, in_rate = _fit(sizes, ins)
    return DiskProfile(
        directory=str(path.resolve()), cache_bypass=how, sizes_bytes=sizes,
        pageout_s=tuple(outs), pagein_s=tuple(ins), pageout_latency_s=out_latency, pageout_throughput_bytes_per_s=out_rate,
        pagein_latency_s=in_latency, pagein_throughput_bytes_per_s=in_rate, power_w=power, energy_source=source,
    )


# ---- a traced model's nodes ----------------------------------------------------------------------------


def profile_model(
    module: nn.Module,
    example_inputs,
    loss_fn: Callable,
    targets=None,
    *,
    name: str,
    batch_size: int,
    fuse: bool = False,
    repeats: int = 3,
    warmup: int = 1,
    rapl: Rapl | None = None,
    compute_power_w: float = MODEL_CORE_POWER_W,
    progress: bool = False,
    clock: str = "wall",
):
    """(graph, ModelProfile): the traced graph and each node's measured runtime and energy, plus one whole
    step's runtime. Leaves the module's parameters, buffers and gradients as they were."""
    from tqdm.auto import tqdm

    from poetlab.torch.trace import restored_state, trace_step

    traced = trace_step(module, example_inputs, loss_fn, targets, fuse=fuse, name=name)
    graph = traced.graph
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    grads = {p: p.grad for p in module.parameters()}
    timings = []
    try:
        with restored_state(module), planned_kernels():  # (the executor's kernels)
            for index in tqdm(range(graph.n_nodes), desc=f"profiling {name}", disable=not progress, leave=False):
                node = graph.nodes[index]
                if node.kind == "input":
                    timings.append(NodeTiming(node.name, 0.0, 0.0))
                    continue
                probe = traced.node_probe(index)
                start = rapl.read_uj() if rapl else None
                if node.is_backward:
                    seconds, samples = median_time(probe.run_backward, repeats, warmup, prepare=probe.forward, clock=clock)
                else:
                    seconds, samples = median_time(lambda _: probe.forward(), repeats, warmup, clock=clock)
                energy = rapl.joules_since(start) / (repeats + warmup) if rapl else seconds * compute_power_w
                timings.append(NodeTiming(node.name, seconds, energy, samples))

            now = CLOCKS[clock]
            forward_samples, step_samples_list = [], []
            for i in range(warmup + repeats):  # whole steps, their forward pass timed on its own too
                start = now()
                out = module(*inputs)
                loss = loss_fn(out) if targets is None else loss_fn(out, targets)
                forward_end = now()
                loss.backward()
                end = now()
                for p in module.parameters():
                    p.grad = None
                del out, loss
                if i >= warmup:
                    forward_samples.append(forward_end - start)
                    step_samples_list.append(end - start)
            step_s, step_samples = statistics.median(step_samples_list), tuple(step_samples_list)
            forward_s = statistics.median(forward_samples)
            reruns = _rerun_samples(traced, inputs, loss_fn, targets, repeats, warmup, clock)
            timings = [
                replace(t, rerun_s=statistics.median(reruns[k]), rerun_samples_s=tuple(reruns[k])) if k in reruns else t
                for k, t in enumerate(timings)
            ]
    finally:
        for p, g in grads.items():
            p.grad = g
    return graph, ModelProfile(name, batch_size, fuse, tuple(timings), step_s, step_samples, forward_s)


def _rerun_samples(traced, inputs: tuple, loss_fn: Callable, targets, repeats: int, warmup: int, clock: str, stride: int = RERUN_STRIDE) -> dict[int, list[float]]:
    """Per forward node (not an input, not the loss): the times of its rerun as the executor reruns it, in
    the middle of a backward pass: from a pre-hook on the autograd node of its output, i.e. just before
    autograd computes its gradient, where a checkpointing schedule reruns it, its fx nodes as generated code
    (``poetlab.torch.execute.group_function``, a rerun's: BatchNorm through its stand-in) on detached aliases of the step's own inputs of it, with grad on and
    what autograd saves collected by a ``list.append`` pack hook (``poetlab.torch.execute._Run._recompute``). Each
    step reruns every ``stride``-th node, in turn; ``(warmup + repeats) * stride`` whole steps (the model as
    its fx trace's generated code, which also returns every node's inputs), the first ``warmup * stride``
    dropped: each node has ``repeats`` samples.

    Why: a rerun there costs more than the same node run alone over and over (on this machine 1.0-1.9x
    for nodes of a millisecond or more, up to 12x for the smallest), because the backward operations since
    its first run have evicted its inputs and weights from the caches; and with grad on it costs more than
    under the grad mode autograd runs pre-hooks with (off). Probed as the executor reruns, the price
    follows the executed reruns (docs/benchmarks.md). These samples are the recompute's price as they are (``CostModel.from_profile``)."""
    from torch import fx

    from poetlab.torch.execute.codegen import bind_graph, generated_module, group_function
    from poetlab.torch.execute.graphless import detached_aliases
    from poetlab.torch.execute.state import never_unpacked
    from poetlab.torch.trace import tensors_in

    graph = traced.graph
    gm = traced.gm
    binding = bind_graph(graph, gm)
    forward = [k for k, node in enumerate(graph.nodes) if not node.is_backward and node.kind not in ("input", "loss")]
    reruns = {k: group_function(gm, binding.members[k], (binding.members[k][-1].name,), rerun=True) for k in forward}
    needed = list(dict.fromkeys([d for k in forward for d in reruns[k].deps] + [binding.members[k][-1] for k in forward]))
    copied = fx.Graph()
    mapping: dict[fx.Node, fx.Node] = {}
    copied.output((copied.graph_copy(gm.graph, mapping), tuple(mapping[n] for n in needed)))
    step = generated_module(gm, copied)
    names = [n.name for n in needed]
    now = CLOCKS[clock]
    samples: dict[int, list[float]] = {k: [] for k in forward}

    def rerun(nodes: list[int], values: dict[str, object], keep: bool) -> None:
        for k in nodes:
            args = [detached_aliases(values[d.name]) for d in reruns[k].deps]
            saved: list[torch.Tensor] = []
            start = now()
            with torch.autograd.graph.saved_tensors_hooks(saved.append, never_unpacked), torch.enable_grad():
                reruns[k].run(*args)
            if keep:
                samples[k].append(now() - start)
            saved.clear()

    for s in range((warmup + repeats) * stride):
        out, extra = step(*inputs)
        values = dict(zip(names, extra, strict=True))
        del extra
        loss = loss_fn(out) if targets is None else loss_fn(out, targets)
        del out
        by_fn: dict[object, list[int]] = {}
        for k in forward[s % stride::stride]:
            fn = next((t.grad_fn for t in tensors_in(values[binding.members[k][-1].name]) if t.grad_fn is not None), None)
            if fn is not None:
                by_fn.setdefault(fn, []).append(k)
        for fn, nodes in by_fn.items():
            fn.register_prehook(lambda *_, nodes=nodes, keep=s >= warmup * stride: rerun(nodes, values, keep))
        del by_fn
        try:
            loss.backward()
        finally:
            values.clear()  # (the pre-hooks hold it, and it holds tensors whose autograd nodes hold them)
            del loss
        for p in gm.parameters():
            p.grad = None
    return {k: times for k, times in samples.items() if times}


def default_profile_dir() -> Path:
    """Where host profiles are kept: ``profiles/`` of :func:`~poetlab.core.data.data_dir`."""
    return data_dir() / "profiles"


def default_profile_path(model: str | None, fuse: bool = False) -> Path:
    stem = "host-" + (model or "disk") + ("-fused" if fuse and model else "")
    return default_profile_dir() / f"{stem}.json"


def find_host_profile(model: str | None, fuse: bool = False, directory: Path | None = None) -> Path:
    """The profile to cost ``model`` on the host: its own (fused or not) if present, else any host profile
    in ``directory`` (its disk and matmul rate still apply); a one-line error when there is none."""
    directory = directory or default_profile_dir()
    candidates = [default_profile_path(model, fuse).name, default_profile_path(model, False).name] if model else []
    for name in candidates:
        if (directory / name).is_file():
            return directory / name
    others = sorted(directory.glob("host-*.json")) if directory.is_dir() else []
    if others:
        return others[0]
    raise ProfileFileError(
        f"no host profile in {directory}; run `poetlab profile --platform host{f' --model {model}' if model else ''}` or pass --profile FILE"
    )


def profile_host(
    paging_dir: str | os.PathLike[str],
    *,
    model: str | None = None,
    batch_size: int = 1,
    fuse: bool = False,
    repeats: int = 3,
    warmup: int = 1,
    threads: int = 1,
    disk_sizes_bytes: Sequence[int] = DEFAULT_DISK_SIZES_BYTES,
    disk_repeats: int = 3,
    compute_power_w: float | None = None,
    memory_power_w: float = MODEL_MEMORY_POWER_W,
    rapl_root: Path = RAPL_ROOT,
    progress: bool = False,
    clock: str | None = None,
) -> HostProfile:
    """Profile this machine: disk, matmul rate, power, and (with ``model``, a name of
    :data:`poetlab.torch.models.TORCH_MODELS`) that model's traced nodes. ``clock`` (see :data:`CLOCKS`)
    defaults to ``cpu`` with one thread and ``wall`` with more; paging is always wall time."""
    if repeats < 1 or warmup < 0 or threads < 1 or disk_repeats < 1:
        raise InvalidArgumentError("repeats, threads and disk repeats must be positive and warm-up non-negative")
    clock = clock or ("cpu" if threads == 1 else "wall")
    if clock not in CLOCKS or (clock == "cpu" and threads > 1):
        raise InvalidArgumentError(f"clock must be one of {', '.join(CLOCKS)} (cpu only with one thread), got {clock!r}")
    rapl = Rapl.open(rapl_root)
    notes = []
    if rapl is None:
        power = compute_power_w if compute_power_w is not None else threads * MODEL_CORE_POWER_W
        notes.append(
            f"RAPL not readable under {rapl_root}: every energy is modeled (compute {power:g} W = {threads} threads x "
            f"{MODEL_CORE_POWER_W:g} W per core, paging {memory_power_w:g} W; see poetlab.torch.profile)"
        )
    else:
        power = compute_power_w or threads * MODEL_CORE_POWER_W
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        disk = profile_disk(paging_dir, disk_sizes_bytes, disk_repeats, rapl, memory_power_w)
        flops = matmul_flops_per_s(threads, clock=clock)
        model_profile = None
        if model is not None:
            from poetlab.torch.models import build_torch_model

            built = build_torch_model(model, batch_size)
            _, model_profile = profile_model(
                built.module, built.inputs, built.loss_fn, built.targets, name=model, batch_size=batch_size,
                fuse=fuse, repeats=repeats, warmup=warmup, rapl=rapl, compute_power_w=power, progress=progress, clock=clock,
            )
            if rapl is not None and model_profile.node_runtime_sum_s > 0:
                energy = sum(n.energy_j for n in model_profile.nodes)
                power = energy / model_profile.node_runtime_sum_s  # the measured mean compute power
    finally:
        torch.set_num_threads(previous)
    return HostProfile(
        machine=MachineInfo.here(threads), flops_per_s=flops, compute_power_w=power,
        energy_source="model" if rapl is None else "rapl", disk=disk, repeats=repeats, warmup=warmup,
        model=model_profile, notes=tuple(notes), clock=clock,
    )

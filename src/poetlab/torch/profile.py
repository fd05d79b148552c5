"""The ``host`` platform, measured: per-node runtimes of a traced model, paging to a real file, power.

The paper platforms are coefficient files; ``host`` is whatever machine this runs on, so it is measured:

- **Nodes**: each node of a traced training graph (:mod:`poetlab.torch.trace`) runs alone on its recorded
  inputs (:mod:`poetlab.torch.probes`): a forward node's forward, a backward node's backward (its forward rerun untimed before each
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
torch version and threads, date) beside the numbers; its data classes and file format are
:mod:`poetlab.torch.host_profile`. :meth:`HostProfile.platform` turns it into a
:class:`~poetlab.core.platforms.Platform` and :meth:`poetlab.core.costs.CostModel.from_profile` into per-node costs.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from poetlab.errors import InvalidArgumentError, OutputError, PoetlabError
from poetlab.torch.host_profile import DiskProfile, HostProfile, MachineInfo, ModelProfile, NodeTiming
from poetlab.torch.kernels import planned_kernels
from poetlab.torch.paging import PageStore, PagingError

log = logging.getLogger("poetlab.profile")

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


class PagingDirError(OutputError):
    """A paging directory that does not exist, is not writable, or has too little space."""


# ---- energy counters ----------------------------------------------------------------------------------


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
    from poetlab.progress import progress_bar
    from poetlab.torch.probes import restored_state
    from poetlab.torch.trace import trace_step

    traced = trace_step(module, example_inputs, loss_fn, targets, fuse=fuse, name=name)
    graph = traced.graph
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    grads = {p: p.grad for p in module.parameters()}
    timings = []
    try:
        with restored_state(module), planned_kernels():  # (the executor's kernels)
            for index in progress_bar(range(graph.n_nodes), desc=f"profiling {name}", disable=not progress, leave=False):
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
            reruns = rerun_samples(traced, inputs, loss_fn, targets, repeats, warmup, clock)
            timings = [
                replace(t, rerun_s=statistics.median(reruns[k]), rerun_samples_s=tuple(reruns[k])) if k in reruns else t
                for k, t in enumerate(timings)
            ]
    finally:
        for p, g in grads.items():
            p.grad = g
    return graph, ModelProfile(name, batch_size, fuse, tuple(timings), step_s, step_samples, forward_s)


def rerun_samples(traced, inputs: tuple, loss_fn: Callable, targets, repeats: int, warmup: int, clock: str, stride: int = RERUN_STRIDE) -> dict[int, list[float]]:
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
    from poetlab.torch.probes import tensors_in

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

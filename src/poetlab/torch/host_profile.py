"""``poetlab.torch.host_profile``: a measured host as data: the :class:`HostProfile` and its parts, their JSON
file, and where profiles are kept.

:mod:`poetlab.torch.profile` measures them; reading a profile (the CLI, Table 2, the cost model) needs none of
the measuring code, so it lives apart.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform as _platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from poetlab.core.data import data_dir
from poetlab.core.files import read_text_or_raise, write_text_atomic
from poetlab.core.platforms import Platform
from poetlab.errors import PoetlabError
from poetlab.torch.kernels import CONVOLUTION_KERNELS, cpu_capability

PROFILE_FORMAT_VERSION = 2
#: versions still read: version 1's rerun times were taken another way (under the backward pass's grad mode,
#: off, interpreted), which the cost model no longer prices by: read without them (reruns priced as computes)
_READABLE_VERSIONS = (1, PROFILE_FORMAT_VERSION)


class ProfileFileError(PoetlabError, ValueError):
    """A host profile JSON file that is missing, unreadable or does not follow the format."""


# ---- the profile ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineInfo:
    """The machine a profile was taken on, recorded beside the numbers so that a profile says where it holds."""

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
    """One profile of this machine (:func:`poetlab.torch.profile.profile_host`): what the ``host`` platform and
    the per-node costs of a traced model are made from."""

    machine: MachineInfo
    flops_per_s: float
    compute_power_w: float
    energy_source: str  # "rapl" or "model": where every energy figure in this profile comes from
    disk: DiskProfile
    repeats: int
    warmup: int
    model: ModelProfile | None = None
    notes: tuple[str, ...] = field(default=())
    clock: str = "wall"  # how node and step times were taken (see poetlab.torch.profile.CLOCKS); paging is always wall time

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
        _check_numbers(profile, origin)
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
        except RecursionError:
            raise ProfileFileError(f"{path}: the JSON is nested too deeply to be a host profile; re-run `poetlab profile`") from None
        return cls.from_dict(data, str(path))


#: The largest time (seconds) a profile may hold for one node, one step or one page transfer: a day.
MAX_PROFILE_SECONDS = 86_400.0


def _check_numbers(profile: HostProfile, origin: str) -> None:
    """Every number of ``profile`` finite and in range, else a one-line ProfileFileError naming the field
    and the valid range: rates and powers positive, times and energies non-negative and at most
    :data:`MAX_PROFILE_SECONDS` (energies at most that many seconds at the profile's compute power)."""

    def fail(field_name: str, value: object, valid: str) -> ProfileFileError:
        return ProfileFileError(f"{origin}: field {field_name!r} is {value!r}; it must be {valid}; re-run `poetlab profile`")

    def positive(field_name: str, value: float, high: float) -> None:
        if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= high):
            raise fail(field_name, value, f"positive, finite and at most {high:g}")

    def seconds(field_name: str, value: float | None, high: float = MAX_PROFILE_SECONDS) -> None:
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= high):
            raise fail(field_name, value, f"positive or zero, finite and at most {high:g}")

    positive("flops_per_s", profile.flops_per_s, 1e18)
    positive("compute_power_w", profile.compute_power_w, 1e6)
    d = profile.disk
    positive("disk.pagein_throughput_bytes_per_s", d.pagein_throughput_bytes_per_s, 1e14)
    positive("disk.pageout_throughput_bytes_per_s", d.pageout_throughput_bytes_per_s, 1e14)
    positive("disk.power_w", d.power_w, 1e6)
    seconds("disk.pagein_latency_s", d.pagein_latency_s)
    seconds("disk.pageout_latency_s", d.pageout_latency_s)
    for key in ("pagein_s", "pageout_s"):
        for value in getattr(d, key):
            seconds(f"disk.{key}", value)
    model = profile.model
    if model is None:
        return
    seconds("model.step_runtime_s", model.step_runtime_s)
    seconds("model.forward_runtime_s", model.forward_runtime_s)
    for value in model.step_samples_s:
        seconds("model.step_samples_s", value)
    max_energy = MAX_PROFILE_SECONDS * max(profile.compute_power_w, d.power_w)
    for index, node in enumerate(model.nodes):
        where = f"model.nodes[{index}]"
        seconds(f"{where}.runtime_s", node.runtime_s)
        seconds(f"{where}.rerun_s", node.rerun_s)
        seconds(f"{where}.energy_j", node.energy_j, max_energy)
        for value in (*node.samples_s, *node.rerun_samples_s):
            seconds(f"{where}.samples_s", value)


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


# ---- where profiles are kept ---------------------------------------------------------------------------


def default_profile_dir() -> Path:
    """Where host profiles are kept: ``profiles/`` of :func:`~poetlab.core.data.data_dir`."""
    return data_dir() / "profiles"


def default_profile_path(model: str | None, fuse: bool = False) -> Path:
    from poetlab.torch.user_models import user_model_name

    stem = "host-" + (user_model_name(model) if model else "disk") + ("-fused" if fuse and model else "")
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


def host_costs(graph, profile: str | Path | HostProfile | None = None, *, model: str | None = None, fuse: bool = False):
    """The costs of ``graph`` on this machine, in one call, and which they are: ``(CostModel, source)``.

    ``profile`` is a host profile (a :class:`HostProfile` or its JSON file; by default the one
    ``poetlab profile --platform host --model MODEL`` wrote for ``model``, else any in
    ``data/profiles/``). Where that profile timed this very graph (same node names), each node costs its
    measured time (``source == "profiled"``: :meth:`CostModel.from_profile`); otherwise every node costs its
    flops at the profile's measured matmul rate (``"flops at the measured rate"``), which undercounts
    element-wise and memory-bound nodes (run ``poetlab profile --model path.py:FUNCTION`` for a user's model)."""
    from poetlab.core.costs import CostModel

    if not isinstance(profile, HostProfile):
        profile = HostProfile.load(profile or find_host_profile(model, fuse))
    timed = profile.model
    if timed is not None and tuple(n.name for n in timed.nodes) == tuple(n.name for n in graph.nodes):
        return CostModel.from_profile(graph, profile), "profiled"
    return CostModel.from_flops(graph, profile.platform()), "flops at the measured rate"

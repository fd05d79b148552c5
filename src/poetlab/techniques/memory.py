"""Peak memory of a piece of PyTorch work, measured from the CPU allocator.

On a machine without a GPU there is no ``torch.cuda.max_memory_allocated``; the profiler's memory
events (``torch.profiler.profile(profile_memory=True)``) record every allocation and free of the CPU
allocator with its size, in every thread (the autograd engine included). Their running sum over the
work is the memory that the work itself allocated at each instant; its maximum is the measured peak.
What existed before the work started (the parameters, the input batch) is not in it: callers add
those bytes themselves and say so. Parts of the work wrapped in :func:`phase` get their own peak (the
running sum, which includes what earlier parts left allocated, at its highest inside that part).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from poetlab.torch.allocations import quiet_profiler_stderr

_PHASE_PREFIX = "poetlab.phase:"


def phase(name: str) -> record_function:
    """A context manager that marks a part of the measured work as the phase ``name``."""
    return record_function(_PHASE_PREFIX + name)


@dataclass(frozen=True)
class MemoryMeasurement:
    """``peak_bytes``: the most bytes the work held at once beyond what existed before it started;
    ``net_bytes``: what it still held at its end (e.g. gradients left in ``.grad``); ``phase_peaks``:
    (phase, peak) for each :func:`phase` in the work, in order."""

    peak_bytes: int
    net_bytes: int
    n_events: int
    phase_peaks: tuple[tuple[str, int], ...] = ()

    def phase_peak(self, name: str) -> int:
        return max((peak for phase_name, peak in self.phase_peaks if phase_name == name), default=0)


def measure_peak_bytes(work: Callable[[], object]) -> MemoryMeasurement:
    """Run ``work()`` under the profiler and return the peaks of its running allocation sum."""
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_profiler_stderr():
        prof.start()
    try:
        work()
    finally:
        with quiet_profiler_stderr():
            prof.stop()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda event: event.start_ns())
    phases = [
        (event.name()[len(_PHASE_PREFIX):], event.start_ns(), event.start_ns() + event.duration_ns())
        for event in events
        if event.name().startswith(_PHASE_PREFIX)
    ]
    phase_peak = [0] * len(phases)
    running = peak = n_events = 0
    for event in events:
        if event.name() != "[memory]":
            continue
        n_events += 1
        running += int(event.nbytes())
        peak = max(peak, running)
        for index, (_, start, end) in enumerate(phases):
            if start <= event.start_ns() <= end:
                phase_peak[index] = max(phase_peak[index], running)
    return MemoryMeasurement(
        peak_bytes=peak,
        net_bytes=running,
        n_events=n_events,
        phase_peaks=tuple((name, value) for (name, _, _), value in zip(phases, phase_peak, strict=True)),
    )


def tensor_bytes(tensors: object) -> int:
    """Bytes of the distinct storages behind ``tensors`` (an iterable of tensors)."""
    seen: dict[int, int] = {}
    for tensor in tensors:  # type: ignore[union-attr]
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def parameter_bytes(module: torch.nn.Module, trainable_only: bool = False) -> int:
    return tensor_bytes(p for p in module.parameters() if p.requires_grad or not trainable_only)

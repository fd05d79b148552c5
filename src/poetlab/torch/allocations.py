"""Peak memory of a block of code, measured from the CPU allocator's own events.

On a machine without a GPU there is no ``memory_allocated()`` counter, so we read the allocator through
``torch.profiler.profile(profile_memory=True)``: every allocation and free of PyTorch's CPU allocator is
an event with its address, byte count and time stamp. Summing them in time order gives the bytes
allocated since the block started, and its maximum is the peak: a number from the allocator, not from
our own bookkeeping of what a schedule holds. Memory that existed before the block (parameters, the
batch) is the zero line.

:meth:`AllocationPeak.peak_excluding` leaves out the allocations of given tensors that are still alive at
the end (a step's parameter gradients, which POET keeps outside the activation budget), found by their
addresses: what remains is the peak of activations, saved tensors, gradients of activations and
transient workspace.

The profiler slows the code it watches, so wall times are taken in separate, unprofiled runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from poetlab.errors import PoetlabError


@dataclass
class AllocationPeak:
    """Filled in when the ``measure_allocations`` block ends: every allocation event (time, address,
    bytes; negative bytes for a free), the peak and the final bytes above the start."""

    events: list[tuple[int, int, int]] = field(default_factory=list)
    peak_bytes: int = 0
    final_bytes: int = 0

    def peak_excluding(self, addresses: Iterable[int]) -> int:
        """The peak without the last allocation at each of ``addresses`` (tensors alive at the end)."""
        wanted = set(addresses)
        last: dict[int, int] = {}
        for k, (_, ptr, nbytes) in enumerate(self.events):
            if ptr in wanted and nbytes > 0:
                last[ptr] = k
        skip = set(last.values())
        current = peak = 0
        for k, (_, _, nbytes) in enumerate(self.events):
            if k not in skip:
                current += nbytes
                peak = max(peak, current)
        return peak


def _allocations(nodes, found: list[tuple[int, int, int]]) -> None:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            found.append((node.start_time_ns, int(fields.ptr), int(fields.alloc_size)))
        stack.extend(node.children)


def _allocated_in_block(events: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``events`` without the frees of memory allocated before the block. Python's garbage collector
    frees the tensors of unreachable reference cycles whenever it runs, in the middle of the block too,
    and the allocator reports the free of a block allocated under an earlier profiler session (an earlier
    measured step): counted, those frees would push the sum below the zero line and hide the block's own
    peak (seen: a collection in a MobileNetV2 step, after other tests, freed ~2 MB of an earlier step's
    garbage, and the step's measured peak came out below the schedule's)."""
    live: set[int] = set()
    kept = []
    for event in events:
        _, ptr, nbytes = event
        if nbytes > 0:
            live.add(ptr)
        elif ptr in live:
            live.discard(ptr)
        else:
            continue
        kept.append(event)
    return kept


@contextmanager
def quiet_profiler_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null: the pinned torch's profiler prints a "USDT: ... profiler_start"
    (and "profiler_stop") line to the process's stderr, from C++, each time it starts and stops, which
    would break every command's one-line output. Only the profiler's start and stop run inside."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def measure_allocations() -> Iterator[AllocationPeak]:
    """Context manager yielding an :class:`AllocationPeak` that is filled in at exit."""
    result = AllocationPeak()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with quiet_profiler_stderr():
        prof.start()
    try:
        yield result
    finally:
        with quiet_profiler_stderr():
            prof.stop()
    events: list[tuple[int, int, int]] = []
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None or not hasattr(results, "experimental_event_tree"):  # (a private API of the pinned torch)
        raise PoetlabError(f"torch {torch.__version__}'s profiler has no allocation event tree; install the pinned torch (pyproject.toml) to measure peaks")
    _allocations(results.experimental_event_tree(), events)
    events.sort(key=lambda item: item[0])
    result.events = _allocated_in_block(events)
    current = peak = 0
    for _, _, nbytes in result.events:
        current += nbytes
        peak = max(peak, current)
    result.peak_bytes, result.final_bytes = peak, current

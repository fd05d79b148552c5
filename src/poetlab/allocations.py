"""Peak memory of a block of code, measured from the CPU allocator's own events.

On a machine without a GPU there is no ``memory_allocated()`` counter, so we read the allocator through
``torch.profiler.profile(profile_memory=True)``: every allocation and free of PyTorch's CPU allocator is
an event with a byte count and a time stamp, on every thread (page-ins on the reader thread included).
Summing them in time order gives the bytes allocated since the block started, and its maximum is the
peak: a number from the allocator, not from our own bookkeeping of what a schedule holds. Memory that
existed before the block (parameters, the batch) is the zero line.

The profiler slows the code it watches, so wall times are taken in separate, unprofiled runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile


@dataclass
class AllocationPeak:
    """Filled in when the ``measure_allocations`` block ends: peak and final bytes above the start."""

    peak_bytes: int = 0
    final_bytes: int = 0
    n_events: int = 0


@contextmanager
def measure_allocations() -> Iterator[AllocationPeak]:
    """Context manager yielding an :class:`AllocationPeak` that is filled in at exit."""
    result = AllocationPeak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        yield result
    # kineto_results holds every memory event; prof.events() keeps only those it can attach to an op.
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda item: item[0])
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    result.peak_bytes, result.final_bytes, result.n_events = peak, current, len(events)

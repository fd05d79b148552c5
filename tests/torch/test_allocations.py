"""``poetlab.torch.allocations``: peaks read from the CPU allocator's own events, with real tensors."""

from __future__ import annotations

import torch

from poetlab.torch.allocations import measure_allocations

MIB = 2**20


def _tensor(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes // 4, dtype=torch.float32)


def test_peak_is_the_most_the_block_held_at_once():
    with measure_allocations() as allocation:
        a = _tensor(2 * MIB)
        del a
        b = _tensor(MIB)
    assert 2 * MIB <= allocation.peak_bytes < 2 * MIB + 4096
    assert MIB <= allocation.final_bytes < MIB + 4096
    assert 2 * MIB <= allocation.peak_excluding([b.data_ptr()]) < 2 * MIB + 4096


def test_peak_excluding_leaves_out_tensors_alive_at_the_end():
    """A step's parameter gradients, kept outside the activation budget: found by address."""
    with measure_allocations() as allocation:
        grad = _tensor(3 * MIB)
        transient = _tensor(MIB)
        del transient
    assert allocation.peak_bytes >= 4 * MIB
    assert MIB <= allocation.peak_excluding([grad.data_ptr()]) < MIB + 4096


def test_frees_of_memory_from_before_the_block_do_not_hide_its_peak():
    """Python's garbage collector may free an old cycle's tensors in the middle of a measured step. The
    allocator reports the free of a block allocated under an earlier profiler session (an earlier measured
    step); counted, it would take the sum below zero and the step's own allocations would not show."""
    with measure_allocations():
        before = _tensor(8 * MIB)
    with measure_allocations() as allocation:
        del before
        now = _tensor(MIB)
    assert MIB <= allocation.peak_bytes < MIB + 4096
    assert MIB <= allocation.final_bytes < MIB + 4096
    assert now.numel() * 4 == MIB

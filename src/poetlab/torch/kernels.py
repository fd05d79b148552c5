"""The CPU kernels a planned step runs on, chosen so that the memory model holds on every CPU.

NOTE [kernel choice]: the simulator's memory model counts the graph's tensors, and the executor allows
one operation's transient workspace on top (:func:`poetlab.torch.execute.memory_allowance_bytes`: a
convolution's im2col buffer). That is the workspace of PyTorch's own CPU convolution (im2col + GEMM).
oneDNN (``torch.backends.mkldnn``), which PyTorch picks for convolutions when it is enabled, allocates
scratch buffers of its own whose size depends on the instruction set it dispatches for at run time; on
an AVX2-only CPU they dwarf a small model's tensors (``docs/kernels.md``, ``benchmarks/bench_kernels.py``).
Memory a planner cannot see cannot be planned, so every step that runs a schedule, and every plain step
it is compared with or profiled by, runs inside :func:`planned_kernels`: oneDNN off, convolutions on
PyTorch's native kernels, the same on every CPU. The cost is speed (``docs/kernels.md``).

Gradients are bit-equal only between steps run on the same kernels: compare an executed schedule with a
plain step taken inside :func:`planned_kernels` too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: what :func:`planned_kernels` runs convolutions on (recorded in host profiles and benchmark rows)
CONVOLUTION_KERNELS = "aten-native"

__all__ = ["CONVOLUTION_KERNELS", "cpu_capability", "planned_kernels"]


@contextmanager
def planned_kernels() -> Iterator[None]:
    """Run the block with oneDNN off (convolutions on PyTorch's native kernels), then put the setting back.

    The setting is process-wide (``torch.backends.mkldnn.enabled``), as PyTorch keeps it: a step run in
    another thread at the same time sees it too."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous


def cpu_capability() -> str:
    """The instruction set PyTorch dispatches its CPU kernels for here (``"AVX2"``, ``"AVX512"``, ...)."""
    return str(torch.backends.cpu.get_cpu_capability())

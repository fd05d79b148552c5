""":func:`execute` (one step), :func:`memory_allowance_bytes` and :func:`retain_freed_memory` (NOTE [10]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule, simulate
from poetlab.torch.execute.executor import ScheduleExecutor
from poetlab.torch.execute.result import ExecutionError

if TYPE_CHECKING:
    from poetlab.torch.execute.result import ExecutionResult


# ---- the functions ---------------------------------------------------------------------------

#: glibc's ``mallopt`` parameters (malloc.h) and what :func:`retain_freed_memory` sets them to
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_RETAINED_MMAP_THRESHOLD = 32 * 2**20  # (glibc's largest: HEAP_MAX_SIZE / 2 on 64-bit)
_RETAINED_TRIM_THRESHOLD = 2**31 - 1  # (an int: mallopt takes a C int)


def retain_freed_memory() -> bool:
    """Make the C allocator keep freed blocks for reuse instead of handing them back to the kernel;
    True where it could (glibc), False elsewhere (nothing changed). Process-wide: for the programs that
    run schedules (the ``execute`` command, the benchmarks), not something the library does by itself.

    Why: glibc serves blocks from 128 KiB up with ``mmap`` and returns them with ``munmap`` when freed (and
    trims its heap's free top), so the next tensor of that size page-faults fresh, zeroed pages in. A
    plain step frees its activations only at the end and settles into reusing the same blocks; a schedule
    that frees a tensor mid-step and recomputes or pages it back in paid those page faults on every step
    (thousands a step on MobileNetV2, none with this: docs/benchmarks.md). How many depends on the
    process's past, since glibc raises its thresholds as large blocks are freed. With this the
    blocks stay in the heap whatever came before: what a device's fixed arena does. The allocator's
    accounting, which is what the executor measures as peak, is not changed; the process's resident size
    stays at its high-water mark."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _RETAINED_MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _RETAINED_TRIM_THRESHOLD))


def memory_allowance_bytes(module: nn.Module, graph: TrainingGraph) -> int:
    """How far an executed step's measured peak (parameter gradients left out) may exceed the simulator's,
    and why: the simulator counts the graph's tensors, the allocator also sees each operation's transient
    workspace. The largest is a convolution's: PyTorch's native CPU convolution, which a step runs on
    (NOTE [kernel choice] in :mod:`poetlab.torch.kernels`), and its backward unfold its
    input into kernel-area copies (im2col), at most ``kernel area x`` the largest tensor of the graph; plus
    one more tensor of that size for autograd summing two gradient contributions (a skip connection)
    before it passes the sum on. So: ``(largest kernel area + 1) x`` the graph's largest node."""
    kernel_area = max(
        (math.prod(m.kernel_size) for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)), default=1
    )
    return (kernel_area + 1) * int(graph.output_bytes.max())



def execute(
    module: nn.Module,
    schedule: Schedule,
    batch: tuple[torch.Tensor | Sequence[torch.Tensor], object],
    *,
    graph: TrainingGraph,
    loss_fn: Callable[..., torch.Tensor],
    costs: CostModel | None = None,
    paging_dir: str | None = None,
    prefetch: bool = False,
    durable: bool = True,
    strict: bool = True,
    measure_memory: bool = True,
    ram_budget_bytes: float | None = None,
) -> ExecutionResult:
    """Run one training step of ``module`` on ``batch = (inputs, targets)`` as ``schedule`` says.

    ``graph`` is the :func:`poetlab.torch.trace` graph the schedule was planned on; gradients are added to the
    parameters' ``.grad`` exactly as ``loss_fn(module(inputs), targets).backward()`` would. With
    ``costs``, the result carries the simulator's prediction for the same schedule. With
    ``ram_budget_bytes`` (and ``measure_memory``), a measured peak over it is an :class:`ExecutionError`.
    """
    executor = ScheduleExecutor(module, graph, schedule, loss_fn, paging_dir=paging_dir, prefetch=prefetch, durable=durable, strict=strict)
    result = executor.step(batch[0], batch[1], measure_memory=measure_memory)
    if ram_budget_bytes is not None and result.peak_bytes is not None and result.peak_bytes > ram_budget_bytes:
        raise ExecutionError(
            f"the step's measured peak {result.peak_bytes:,} bytes is over the RAM budget {int(ram_budget_bytes):,} bytes "
            f"(the largest operation's workspace: {graph.workspace_bytes:,}); plan with poetlab.solve at this budget or raise it"
        )
    if costs is not None:
        from dataclasses import replace

        result = replace(result, predicted=simulate(schedule, graph, costs))
    return result

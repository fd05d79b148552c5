"""Run one training step of a real ``nn.Module`` exactly as a :class:`~poetlab.core.schedule.Schedule` says,
with autograd's own engine doing the backward pass. The rules it follows are the numbered NOTE blocks of
``docs/executor.md``; the modules:

- :mod:`~poetlab.torch.execute.api`: :func:`execute` (one step), :func:`memory_allowance_bytes`,
  :func:`retain_freed_memory`;
- :mod:`~poetlab.torch.execute.executor`: :class:`ScheduleExecutor`, a schedule bound to a module once;
- :mod:`~poetlab.torch.execute.layout`: :class:`StepLayout`, what the schedule asks of each node, found
  once, and :class:`StepPlan`, what a step does beyond the reference loop (learnt from the first step);
- :mod:`~poetlab.torch.execute.step`: one step, the reference that advances the schedule op by op;
  :mod:`~poetlab.torch.execute.step_compute` (first runs, reruns, the loss) and
  :mod:`~poetlab.torch.execute.step_records` (storage records, saved-tensor hooks) are its two halves;
- :mod:`~poetlab.torch.execute.state`: storage records, node states, buffers' backups;
- :mod:`~poetlab.torch.execute.codegen`: the graph bound to fx, generated code for groups of nodes;
- :mod:`~poetlab.torch.execute.segments`: the fast path of the steps after the first;
- :mod:`~poetlab.torch.execute.graphless`: managed nodes and graphless first runs;
- :mod:`~poetlab.torch.execute.result`: :class:`ExecutionResult`, :class:`ExecutionError`.
"""

from poetlab.torch.execute.api import execute, memory_allowance_bytes, retain_freed_memory
from poetlab.torch.execute.executor import ScheduleExecutor
from poetlab.torch.execute.result import ExecutionError, ExecutionResult

__all__ = ["ExecutionError", "ExecutionResult", "ScheduleExecutor", "execute", "memory_allowance_bytes", "retain_freed_memory"]

"""What a step returns (:class:`ExecutionResult`) and the error it raises (:class:`ExecutionError`). See docs/executor.md."""

from __future__ import annotations

from dataclasses import dataclass


from poetlab.core.schedule import SimulationResult
from poetlab.errors import PoetlabError


class ExecutionError(PoetlabError, RuntimeError):
    """A schedule, graph or module that the executor cannot run together."""


@dataclass(frozen=True)
class ExecutionResult:
    """One executed step. Bytes and seconds; the prediction is the simulator's for the same schedule.

    ``total_peak_bytes`` is the allocator's peak above the memory in use when the step began, and
    ``peak_bytes`` the same without the parameters' gradients (found by address; POET keeps them outside
    the activation budget): activations, saved tensors, gradients of activations, workspace. Both are
    None when not measured. ``planned_peak_bytes`` is the schedule replayed by our own bookkeeping of
    the graph's bytes as the executor went, each node whole to its free (equal to the simulator's when every op
    was honoured, but where the simulator lets a left-alone node's output go before what autograd saved inside
    it, as PyTorch does by itself: ``TrainingGraph.early_release``).

    ``wall_s`` is the step's wall time; ``cpu_s`` its CPU time on the calling thread (autograd's CPU
    engine runs there too), which other processes' load does not inflate; both from the call's start to
    its end, set-up and clean-up included (what timing the call from outside would give); ``paging_wall_s`` and
    ``paging_cpu_s`` the wall and CPU time spent in page-outs and synchronous page-ins. Waiting for the
    disk is not CPU time, so :attr:`runtime_s` (CPU time outside paging + paging wall time) is the
    number to hold against the simulator's runtime, whose node times are CPU times (:mod:`poetlab.torch.profile`).

    ``recompute_cpu_s`` is the CPU time of the recomputes' reruns (the node's own operations, what the
    simulator prices a recompute at), so that the rest of a step's time beyond a plain step's is the
    executor's own.

    ``n_compresses`` / ``n_decompresses`` count the compress and decompress operations carried out, and
    ``compressed_bytes`` the bytes of all compressed copies made (bitmaps + non-zeros). The planned peak
    counts each compressed copy at its real size, which is at most the simulator's (sized at the profiled
    density plus a margin) when the batch is no denser than that.
    """

    loss: float
    wall_s: float
    cpu_s: float
    paging_wall_s: float
    paging_cpu_s: float
    peak_bytes: int | None
    total_peak_bytes: int | None
    planned_peak_bytes: int
    bytes_written: int
    bytes_read: int
    n_computes: int
    n_recomputes: int
    n_pageouts: int
    n_pageins: int
    n_unplanned: int
    n_skipped_ops: int
    prefetch: bool
    predicted: SimulationResult | None = None
    n_compresses: int = 0
    n_decompresses: int = 0
    compressed_bytes: int = 0
    recompute_cpu_s: float = 0.0

    @property
    def runtime_s(self) -> float:
        return self.cpu_s - self.paging_cpu_s + self.paging_wall_s

    def to_dict(self) -> dict[str, object]:
        row: dict[str, object] = {
            name: getattr(self, name)
            for name in (
                "loss", "wall_s", "cpu_s", "paging_wall_s", "paging_cpu_s", "runtime_s", "peak_bytes", "total_peak_bytes", "planned_peak_bytes", "bytes_written", "bytes_read", "n_computes",
                "n_recomputes", "n_pageouts", "n_pageins", "n_unplanned", "n_skipped_ops", "prefetch", "n_compresses", "n_decompresses", "compressed_bytes", "recompute_cpu_s",
            )
        }
        if self.predicted is not None:
            row["predicted_peak_bytes"] = self.predicted.peak_ram_bytes
            row["predicted_runtime_s"] = self.predicted.runtime_s
            row["predicted_compute_time_s"] = self.predicted.compute_time_s
            row["predicted_paging_time_s"] = self.predicted.paging_time_s
        return row

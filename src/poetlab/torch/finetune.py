"""Training under a schedule for many steps, side by side with plain PyTorch, and the digits run.

:func:`compare_training` trains two copies of one model from the same weights and RNG state on the same
batches: one with plain ``loss.backward()``, one with :class:`~poetlab.torch.execute.ScheduleExecutor` (the
schedule's recomputes and page-outs really happen), each followed by the same optimizer step. With
deterministic algorithms the two loss curves must be identical bit for bit, since a schedule changes
where tensors live, never the arithmetic. It runs twice: once timed (no profiler), once with the
allocator measured on every step (the profiler slows the code it watches), and both passes must agree.

:func:`digits_run` is the fine-tuning demonstration: scikit-learn's digits (1,797 8x8 images that ship
inside the package, no download), a small CNN with BatchNorm and dropout, a few hundred SGD steps under a
memory budget far below checkpoint-all.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from poetlab.torch.allocations import measure_allocations
from poetlab.torch.execute import ScheduleExecutor
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.torch.kernels import planned_kernels

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TrainingComparison:
    """Per-step losses, wall times (s) and allocator peaks (bytes above the step's start, parameter
    gradients left out) of the plain and the scheduled run; ``identical`` when losses and final
    parameters agree bit for bit. ``plain_cpu_s`` is the plain step's thread CPU time and
    ``scheduled_runtime_s`` the scheduled step's CPU time plus its paging wall time
    (:attr:`ExecutionResult.runtime_s`): the load-robust pair, comparable with the simulator's runtime."""

    plain_losses: tuple[float, ...]
    scheduled_losses: tuple[float, ...]
    plain_wall_s: tuple[float, ...]
    scheduled_wall_s: tuple[float, ...]
    plain_peak_bytes: tuple[int, ...]
    scheduled_peak_bytes: tuple[int, ...]
    plain_cpu_s: tuple[float, ...]
    scheduled_runtime_s: tuple[float, ...]
    identical: bool
    n_recomputes: int
    n_pageouts: int
    bytes_written: int
    bytes_read: int

    @property
    def overhead(self) -> float:
        """Median scheduled step time over median plain step time, minus one."""
        return statistics.median(self.scheduled_wall_s) / statistics.median(self.plain_wall_s) - 1

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": len(self.plain_losses),
            "identical": self.identical,
            "plain_losses": list(self.plain_losses),
            "scheduled_losses": list(self.scheduled_losses),
            "plain_wall_s": list(self.plain_wall_s),
            "scheduled_wall_s": list(self.scheduled_wall_s),
            "plain_peak_bytes": list(self.plain_peak_bytes),
            "scheduled_peak_bytes": list(self.scheduled_peak_bytes),
            "median_plain_wall_s": statistics.median(self.plain_wall_s),
            "median_plain_cpu_s": statistics.median(self.plain_cpu_s),
            "median_scheduled_runtime_s": statistics.median(self.scheduled_runtime_s),
            "median_scheduled_wall_s": statistics.median(self.scheduled_wall_s),
            "overhead": self.overhead,
            "n_recomputes_per_step": self.n_recomputes,
            "n_pageouts_per_step": self.n_pageouts,
            "bytes_written_per_step": self.bytes_written,
            "bytes_read_per_step": self.bytes_read,
        }


def compare_training(
    module: nn.Module,
    graph: TrainingGraph,
    schedule: Schedule,
    loss_fn: Callable[..., torch.Tensor],
    batches: Sequence[Batch],
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    *,
    progress: bool = False,
    **options: object,
) -> TrainingComparison:
    """Train copies of ``module`` plainly and under ``schedule`` on ``batches``; ``module`` is left as is.
    Runs with ``torch.use_deterministic_algorithms(True)`` (restored after), without which the two sides
    need not agree bit for bit. ``options`` go to :class:`ScheduleExecutor` (``prefetch``, ``paging_dir``, ...)."""
    from poetlab.progress import progress_bar

    def run(measure: bool):
        """One pass over the batches, plain then scheduled per batch, from fresh copies."""
        plain, scheduled = copy.deepcopy(module), copy.deepcopy(module)
        plain_opt, scheduled_opt = make_optimizer(plain.parameters()), make_optimizer(scheduled.parameters())
        executor = ScheduleExecutor(scheduled, graph, schedule, loss_fn, **options)  # type: ignore[arg-type]
        rows = []
        last = None
        for inputs, targets in progress_bar(batches, desc="training (plain and scheduled)", disable=not progress, leave=False):
            rng = torch.get_rng_state()
            plain_opt.zero_grad(set_to_none=True)
            if measure:
                with measure_allocations() as allocation, planned_kernels():
                    loss = loss_fn(plain(inputs), targets)
                    loss.backward()
                plain_peak = allocation.peak_excluding(p.grad.data_ptr() for p in plain.parameters() if p.grad is not None)
                plain_s = plain_cpu_s = 0.0
                plain_loss = float(loss.detach())
                del loss
            else:  # (the loss read and its graph let go inside the time, as the executor's step does both)
                start, cpu = time.perf_counter(), time.thread_time()
                with planned_kernels():  # (the executor's kernels: NOTE [kernel choice] in poetlab.torch.kernels)
                    loss = loss_fn(plain(inputs), targets)
                    loss.backward()
                plain_loss = float(loss.detach())
                del loss
                plain_s, plain_cpu_s, plain_peak = time.perf_counter() - start, time.thread_time() - cpu, 0
            plain_opt.step()
            rng_after = torch.get_rng_state()
            torch.set_rng_state(rng)
            scheduled_opt.zero_grad(set_to_none=True)
            start = time.perf_counter()
            last = executor.step(inputs, targets, measure_memory=measure)
            scheduled_s = time.perf_counter() - start
            scheduled_opt.step()
            if not torch.equal(torch.get_rng_state(), rng_after):
                raise AssertionError("the scheduled step drew other random numbers than the plain step")
            rows.append((plain_loss, last.loss, plain_s, scheduled_s, plain_peak, last.peak_bytes or 0, plain_cpu_s, last.runtime_s))
        same = all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), scheduled.state_dict().values(), strict=True))
        return rows, same, last

    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # (bit for bit: both sides on the same deterministic kernels)
    try:
        state = torch.get_rng_state()
        timed, same_timed, last = run(measure=False)
        torch.set_rng_state(state)
        measured, same_measured, _ = run(measure=True)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    losses_agree = [r[:2] for r in timed] == [r[:2] for r in measured]
    return TrainingComparison(
        plain_losses=tuple(r[0] for r in timed),
        scheduled_losses=tuple(r[1] for r in timed),
        plain_wall_s=tuple(r[2] for r in timed),
        scheduled_wall_s=tuple(r[3] for r in timed),
        plain_peak_bytes=tuple(r[4] for r in measured),
        scheduled_peak_bytes=tuple(r[5] for r in measured),
        plain_cpu_s=tuple(r[6] for r in timed),
        scheduled_runtime_s=tuple(r[7] for r in timed),
        identical=same_timed and same_measured and losses_agree and all(r[0] == r[1] for r in timed),
        n_recomputes=last.n_recomputes if last else 0,
        n_pageouts=last.n_pageouts if last else 0,
        bytes_written=last.bytes_written if last else 0,
        bytes_read=last.bytes_read if last else 0,
    )


# ---- the digits run ----------------------------------------------------------------------------


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digits: ``depth`` conv-BN-ReLU blocks at 8x8, a 2x2 max-pool, dropout and a
    linear classifier. Deep and narrow on purpose: many activations of similar size, so that a budget
    well below checkpoint-all stays feasible (no single node needs most of it)."""

    def __init__(self, width: int = 16, depth: int = 6, num_classes: int = 10, dropout: float = 0.2):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 1
        for _ in range(depth):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(width * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.flatten(self.pool(self.features(x)))))


def digits_batches(batch_size: int, steps: int, seed: int = 0) -> list[Batch]:
    """``steps`` batches of scikit-learn's digits (scaled to [0, 1]), reshuffled each epoch with ``seed``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    batches: list[Batch] = []
    while len(batches) < steps:
        order = torch.randperm(len(labels), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            batches.append((images[index], labels[index]))
            if len(batches) == steps:
                break
    return batches

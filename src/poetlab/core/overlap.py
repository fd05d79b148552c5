"""The step time of a schedule when page transfers run on a stream of their own, beside the computations:
the timing model of POFO (Beaumont, Eyraud-Dubois & Shilova, NeurIPS 2021), where an offload or a
prefetch proceeds while the processor computes. The POET paper (and :func:`~poetlab.core.schedule.simulate`'s
``runtime_s``) charges a transfer's time on the one stream instead, after the computations before it.

The same schedule, read with two streams (a compute stream and one transfer stream: flash is one
device, so page-outs and page-ins share it):

- a computation (and a compression or decompression, which is processor work) starts when the one before
  it in the schedule has ended, when every input it reads has arrived (a page-in of it has ended), and,
  for a recomputation of a tensor being paged out, when that page-out has ended;
- a transfer is issued where it stands in the schedule: it starts when the computations before it have
  ended, when the transfer before it has ended and, for a page-out, when its tensor exists (for a
  page-in, when the tensor's page-out has ended); it then runs while the computations after it in the
  schedule go on;
- a free of a tensor whose page-out has not ended waits for it: the tensor holds its memory until its
  transfer ends, and nothing after the free in the schedule starts before then. A page-in takes its
  memory where it is issued. So memory changes in the schedule's order: the peak is the simulator's,
  overlap or not, and a schedule valid in :func:`simulate` is valid here.

Where the schedule places its transfers is the planner's choice: a page-out overlaps the computations
between it and the free of its tensor, a page-in those between it and the first computation that reads
it. Every start is at or before the same operation's start in the serial reading, so the overlapped
time is never above ``runtime_s``; computations and transfers each run one at a time, so it is never
below either total.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, Schedule, SimulationResult, simulate


@dataclass(frozen=True)
class OverlapTiming:
    """A schedule's step time with transfers beside the computations, in seconds.

    ``runtime_s``: from the first operation's start to the last one's end (makespan). ``compute_s`` and
    ``transfer_s``: the busy time of each stream (compute includes compression); ``serial_runtime_s``:
    the simulator's one-stream time of the same schedule, their sum. ``hidden_s`` is the transfer time
    that overlap hides, ``serial_runtime_s - runtime_s``."""

    runtime_s: float
    compute_s: float
    transfer_s: float
    serial_runtime_s: float

    @property
    def hidden_s(self) -> float:
        return self.serial_runtime_s - self.runtime_s


def overlapped_timing(schedule: Schedule, graph: TrainingGraph, costs: CostModel, simulation: SimulationResult | None = None) -> OverlapTiming:
    """The two-stream timing of ``schedule`` (see the module's docstring). The schedule is replayed by
    :func:`~poetlab.core.schedule.simulate` first, which refuses an invalid one; pass its ``simulation``
    to skip that replay."""
    sim = simulation if simulation is not None else simulate(schedule, graph, costs)
    inputs = [tuple(set(node.inputs)) for node in graph.nodes]
    compression = costs.compression
    computed = np.zeros(graph.n_nodes, dtype=bool)
    arrives = np.zeros(graph.n_nodes)  # when each tensor's latest page-in ends (0: not being paged in)
    offloaded = np.zeros(graph.n_nodes)  # when each tensor's latest page-out ends
    exists = np.zeros(graph.n_nodes)  # when each tensor's latest computation ended
    issued = 0.0  # the schedule's cursor: when the computations (and waiting frees) before it are done
    transfer_free = 0.0
    compute_s = transfer_s = 0.0
    for op in schedule.ops:
        i = op.node
        if op.kind is OpKind.COMPUTE:
            seconds = float(costs.recompute_runtime_s[i] if computed[i] else costs.runtime_s[i])
            start = max([issued, offloaded[i], *(arrives[j] for j in inputs[i])])
            issued = exists[i] = start + seconds
            computed[i] = True
            compute_s += seconds
        elif op.kind in (OpKind.COMPRESS, OpKind.DECOMPRESS):
            seconds = float((compression.compress_time_s if op.kind is OpKind.COMPRESS else compression.decompress_time_s)[i])
            issued = max(issued, arrives[i]) + seconds
            if op.kind is OpKind.DECOMPRESS:  # the dense tensor exists again once decompressed
                exists[i] = issued
            compute_s += seconds
        elif op.kind is OpKind.PAGE_OUT:
            seconds = float(costs.pageout_time_s[i])
            start = max(issued, transfer_free, exists[i], arrives[i])
            transfer_free = offloaded[i] = start + seconds
            transfer_s += seconds
        elif op.kind is OpKind.PAGE_IN:
            seconds = float(costs.pagein_time_s[i])
            start = max(issued, transfer_free, offloaded[i])
            transfer_free = arrives[i] = start + seconds
            transfer_s += seconds
        elif op.kind is OpKind.FREE:
            issued = max(issued, offloaded[i], arrives[i])
    return OverlapTiming(max(issued, transfer_free), compute_s, transfer_s, sim.runtime_s)

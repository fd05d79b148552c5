"""``poetlab.torch.workspace``: each operation's transient workspace, measured when a model is traced.

A step's tensors are node outputs, what autograd saves, gradients. The allocator also
sees each operation's scratch memory, gone when the operation returns: a convolution's im2col buffer
(kernel area x its input, forward and backward), a matmul's transposed copy, autograd's sum of two
gradient contributions. On small models it is as large as the activations (a U-Net's 3x3 convolutions:
9x their input), so a plan that fits the budget by the simulator's count would not fit it for real.

:func:`measure_workspaces` runs each node of a traced step alone (its probe: :mod:`poetlab.torch.probes`),
forward then backward, on the executor's kernels (:func:`poetlab.torch.kernels.planned_kernels`) inside one
allocator measurement, with a marker allocation of a unique size between runs to cut the event stream
into one piece per run. A run's workspace is its peak above what it leaves allocated (its output, what it
saved, the gradients it returns). The trace keeps each node's (``TrainingGraph.workspace``), which the
simulator and the POET MILP count while that node computes (forward, rerun or backward), and the RNG states
the executor keeps to replay dropout (:func:`rng_reserve_bytes`) and what the loss's storage holds beyond its
value (:func:`loss_storage_bytes`), both in ``TrainingGraph.reserved_bytes``, which :func:`poetlab.solve` keeps
free for the whole step: the RAM budget is a budget of the allocator's bytes. The same runs measure the
gradients each backward node returns, each storage once (:class:`OperationBytes`, :mod:`poetlab.torch.gradients`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from poetlab.torch.allocations import measure_allocations
from poetlab.torch.kernels import planned_kernels
from poetlab.torch.probes import node_probe, tensors_in

if TYPE_CHECKING:
    from poetlab.torch.trace import TracedStep

__all__ = ["OperationBytes", "measure_operations", "measure_workspaces", "loss_storage_bytes", "rng_reserve_bytes"]

_MARKER_BYTES = 7_777_777  # (markers are _MARKER_BYTES + k bytes: k-th cut of the event stream)


def _transient(events: list[tuple[int, int, int]]) -> int:
    """Peak of the running sum of ``events`` above what they allocate and leave allocated (an operation's
    results). Memory that existed before and is freed on the way (a saved tensor autograd lets go of in a
    backward) lowers the running sum but not that line: the simulator holds such a tensor until the
    operation is done, so only the peak above the results is the operation's own."""
    current = peak = 0
    kept: dict[int, int] = {}
    for _, ptr, nbytes in events:
        current += nbytes
        peak = max(peak, current)
        if nbytes > 0:
            kept[ptr] = nbytes
        else:
            kept.pop(ptr, None)
    return max(0, peak - sum(kept.values()))


def rng_reserve_bytes(traced: TracedStep) -> int:
    """Bytes the executor keeps beside a step's tensors to replay random numbers: one saved RNG state (a
    5 KB tensor on CPU) per forward node that draws (dropout), for its rerun (docs/executor.md NOTE [3]),
    and two more: the state read before each node of an executor's first step, held while it runs (and
    until the next node's), and the one read after it, beside it, to learn whether the node drew; in a
    rerun, the state before it is the one put back after it, beside the node's own."""
    graph = traced.graph
    draws = 0
    with torch.random.fork_rng(devices=[]):
        for i, node in enumerate(graph.nodes):
            if node.is_backward or node.kind in ("input", "loss"):
                continue
            before = torch.get_rng_state()
            node_probe(traced, i).forward()
            draws += not torch.equal(before, torch.get_rng_state())
    return (draws + 2) * torch.get_rng_state().numel()


def loss_storage_bytes(traced: TracedStep) -> int:
    """Bytes the loss's storage holds beyond its value: ``MSELoss``'s value is a view of the buffer it
    reduced (a batch-sized tensor, not 4 bytes), which lives as long as the loss, through the whole
    backward pass (a plain step's ``loss.backward()`` and the executor's hold it), where the graph's loss
    node, freed after the loss's gradient, does not reach."""
    index = next(i for i, node in enumerate(traced.graph.nodes) if node.kind == "loss")
    with torch.random.fork_rng(devices=[]):
        loss = node_probe(traced, index).forward()
    return sum(t.untyped_storage().nbytes() - t.numel() * t.element_size() for t in tensors_in(loss))


@dataclass(frozen=True)
class OperationBytes:
    """What each node's run alone showed (:func:`measure_operations`).

    ``workspace``: graph node index -> its operation's transient workspace in bytes (a backward node's is
    its forward node's backward run; nodes that compute nothing, inputs, left out). ``gradient_bytes``:
    backward node index -> the bytes of the gradients it returns for its forward node's inputs, each
    storage once: an add hands the one gradient it receives to both its inputs (a residual connection),
    which the trace's count by input (one gradient per input that requires grad) holds twice."""

    workspace: dict[int, int]
    gradient_bytes: dict[int, int]
    #: backward node index -> its workspace where its forward node is left alone, where lower than
    #: ``workspace`` (``TrainingGraph.workspace_left_alone``)
    workspace_left_alone: dict[int, int]


def _gradient_bytes(grads: list[tuple[torch.Tensor | None, torch.Tensor]]) -> int:
    """Bytes of the gradients in ``grads`` (gradient, input) pairs, each storage once, at the larger of its
    size and its largest gradient's: a gradient that is an expanded view of a smaller one (a sum's,
    broadcast back) is made whole by the node that reads it. An input without a gradient (the element of
    a tuple that a ``getitem`` did not take) counts in full: the engine fills it with zeros for the node
    that made the tuple (a GRU's backward). Never fewer bytes than one per input, but where they share."""
    largest: dict[int, int] = {}
    missing = 0
    for g, t in grads:
        if g is None:
            missing += t.numel() * t.element_size()
            continue
        storage = g.untyped_storage()
        key = storage.data_ptr()
        largest[key] = max(largest.get(key, 0), storage.nbytes(), g.numel() * g.element_size())
    return missing + sum(largest.values())


class _EngineSeed(torch.autograd.Function):
    """Identity on ``x`` whose backward hands on ``seed`` and lets go of it: the incoming gradient of a
    node run alone then lives in autograd's engine only, freed once the node's first operation has used it,
    as in a real step (a fused group's LayerNorm backward reads it; its Linear's come after)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.seed = seed
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        seed = ctx.seed
        del ctx.seed
        return seed, None


def _last_readers_of_their_gradients(graph) -> list[int]:
    """The forward nodes whose backward node is the last reader of every gradient it reads (the backward
    nodes of its consumers): its incoming gradient dies in it, in the engine. Where another backward node
    reads one later (an add hands one gradient to both its inputs), the engine keeps it."""
    backward_of = {f: b for b, f in graph.metadata["backward_of"].items()}  # type: ignore[union-attr]
    index = {node.name: k for k, node in enumerate(graph.nodes)}
    found = []
    for i, node in enumerate(graph.nodes):
        j = index.get(backward_of.get(node.name, ""), -1)
        if j < 0:
            continue
        incoming = [k for k in graph.nodes[j].inputs if graph.nodes[k].is_backward]
        if incoming and all(max(graph.consumers[k]) == j for k in incoming):
            found.append(i)
    return found


def measure_workspaces(traced: TracedStep) -> dict[int, int]:
    """Graph node index -> its operation's transient workspace in bytes (:class:`OperationBytes`)."""
    return measure_operations(traced).workspace


def measure_operations(traced: TracedStep) -> OperationBytes:
    """Run each node of the traced step alone, forward then backward, in one allocator measurement: each
    operation's workspace and each backward node's gradient bytes (:class:`OperationBytes`)."""
    graph = traced.graph
    forward_nodes = [i for i, node in enumerate(graph.nodes) if not node.is_backward and node.kind != "input"]
    markers = 0

    def mark() -> None:
        nonlocal markers
        torch.empty(_MARKER_BYTES + markers, dtype=torch.uint8)  # (allocated and freed at once)
        markers += 1

    returned: dict[int, int] = {}
    alone = [i for i in _last_readers_of_their_gradients(graph) if i in set(forward_nodes)]
    with torch.random.fork_rng(devices=[]), planned_kernels(), measure_allocations() as allocations:
        for i in forward_nodes:
            probe = node_probe(traced, i)
            mark()
            out = probe.forward()
            mark()
            outs = [t for t in tensors_in(out) if t.requires_grad]
            targets = [t for t in probe.grad_targets() if t.requires_grad]
            # (the output's gradient is the step's tensor, not this node's workspace: made before the cut)
            seeds = [torch.ones_like(t) for t in outs]
            mark()
            grads = torch.autograd.grad(outs, targets, seeds, allow_unused=True) if outs and targets else ()
            mark()
            # (the gradients of its inputs, not of parameters: those live in .grad, outside the graph's count)
            returned[i] = _gradient_bytes([(g, t) for g, t in zip(grads, targets) if not isinstance(t, nn.Parameter)])
            del out, outs, targets, seeds, grads
        # each node whose backward is its incoming gradient's last reader, again, that gradient let go of as
        # the engine does (the workspace of a backward node whose forward node the schedule leaves alone)
        for i in alone:
            probe = node_probe(traced, i)
            out = probe.forward()
            outs = [t for t in tensors_in(out) if t.requires_grad]
            targets = [t for t in probe.grad_targets() if t.requires_grad]
            seeds = [torch.ones_like(t) for t in outs]
            outs = [_EngineSeed.apply(t, s).sum() for t, s in zip(outs, seeds, strict=True)]
            units = [torch.ones(()) for _ in outs]
            del seeds
            mark()
            grads = torch.autograd.grad(outs, targets, units, allow_unused=True) if outs and targets else ()
            mark()
            del out, outs, targets, units, grads
    cuts = {_MARKER_BYTES + k: k for k in range(markers)}
    pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(markers + 1)]
    piece = 0
    for event in allocations.events:
        nbytes = event[2]
        if abs(nbytes) in cuts:
            if nbytes > 0:
                piece = cuts[nbytes] + 1
            continue
        pieces[piece].append(event)
    found: dict[int, int] = {}
    backward_of = {f: b for b, f in graph.metadata["backward_of"].items()}  # type: ignore[union-attr]
    index = {node.name: k for k, node in enumerate(graph.nodes)}
    gradient_bytes: dict[int, int] = {}
    for k, i in enumerate(forward_nodes):  # (pieces per node: before it, its forward, its output's gradient, its backward)
        found[i] = _transient(pieces[4 * k + 1])
        name = graph.nodes[i].name
        if name in backward_of:
            found[index[backward_of[name]]] = _transient(pieces[4 * k + 3])
            gradient_bytes[index[backward_of[name]]] = returned[i]
    left_alone: dict[int, int] = {}
    for k, i in enumerate(alone):  # (then pieces per node: its forward and gradient, its backward)
        j = index[backward_of[graph.nodes[i].name]]
        lower = _transient(pieces[4 * len(forward_nodes) + 2 * k + 1])
        if lower < found[j]:
            left_alone[j] = lower
    return OperationBytes(found, gradient_bytes, left_alone)

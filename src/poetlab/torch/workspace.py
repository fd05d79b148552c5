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
value and the gradient that seeds the backward pass (:func:`loss_storage_bytes`), both in ``TrainingGraph.reserved_bytes``, which :func:`poetlab.solve` keeps
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


def _peak(events: list[tuple[int, int, int]], outside: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(peak of the running sum of ``events``, bytes they allocate and leave allocated). Memory that existed
    before and is freed on the way (a saved tensor autograd lets go of in a backward) lowers the running sum.

    ``outside``: addresses of results that no graph tensor holds (the parameters' gradients, which live in
    ``.grad``, outside the budget), left out from their allocation on, as a plain step's measurement
    leaves out ``.grad`` (:meth:`poetlab.torch.allocations.AllocationPeak.peak_excluding`). Subtracted at
    the end instead, they took from the peak bytes that did not exist yet when it happened: a GRU's
    input weights' gradient is made after its timesteps' peak, and its workspace came out 96 bytes."""
    last = {ptr: k for k, (_, ptr, nbytes) in enumerate(events) if nbytes > 0 and ptr in outside}
    skip = set(last.values())
    current = peak = 0
    kept: dict[int, int] = {}
    for k, (_, ptr, nbytes) in enumerate(events):
        if k in skip:
            continue
        current += nbytes
        peak = max(peak, current)
        if nbytes > 0:
            kept[ptr] = nbytes
        else:
            kept.pop(ptr, None)
    return peak, sum(kept.values())


def _transient(events: list[tuple[int, int, int]], outside: frozenset[int] = frozenset()) -> int:
    """Peak of the running sum of ``events`` above what they allocate and leave allocated (an operation's
    results; :func:`_peak`), at least 0. The memory freed on the way is not that line's: where the schedule
    manages a node (NOTE [5] of docs/executor.md) its storages stay until the schedule's free, which the
    simulator counts to that free, so only the peak above the results is the operation's own."""
    peak, kept = _peak(events, outside)
    return max(0, peak - kept)


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
    """Bytes a step holds for its loss through the whole backward pass, where the graph's loss node, freed
    after the loss's gradient, does not reach: the loss's storage (``MSELoss``'s value is a view of the
    buffer it reduced, a batch-sized tensor, not 4 bytes) and the gradient ``loss.backward()`` seeds the
    engine with (ones of the loss's shape), both held until ``backward()`` returns, by a plain step and by
    the executor alike (left out, a cross-entropy step's checkpoint-all peak came out 8 bytes under a
    plain step's measured one)."""
    index = next(i for i, node in enumerate(traced.graph.nodes) if node.kind == "loss")
    with torch.random.fork_rng(devices=[]):
        loss = node_probe(traced, index).forward()
    return sum(t.untyped_storage().nbytes() + t.numel() * t.element_size() for t in tensors_in(loss))


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
    #: ``workspace`` (``TrainingGraph.workspace_left_alone``): its peak above the bytes the simulator counts
    #: for it from its start, below 0 where that peak comes after its saved tensors made room
    workspace_left_alone: dict[int, int]


@dataclass(frozen=True)
class _Gradients:
    """The gradients one node's backward returned for its inputs (parameters left out), by storage."""

    #: gradient storage address -> its bytes, at the larger of its size and its largest gradient's: a
    #: gradient that is an expanded view of a smaller one (a sum's, broadcast back) is made whole by the node
    #: that reads it
    made: dict[int, int]
    #: storage address of each input that got one -> True
    given: frozenset[int]
    #: storage address of each input without one (the element of a tuple that a ``getitem`` did not take)
    #: -> its bytes
    missing: dict[int, int]

    def bytes_with(self, given_elsewhere: frozenset[int]) -> int:
        """Bytes of the gradients, each storage once. An input without a gradient counts in full where no
        other node's backward gives it one: the engine then fills it with zeros for the node that made the
        tuple. Where another does (a GRU's ``out, h``, each taken by a ``getitem``), the engine sums the two
        into one gradient per element, which the other node's backward holds already: counted here too, the
        tuple's gradient was held twice (a GRU's output and final state, 4,224 bytes over a plain step's)."""
        return sum(self.made.values()) + sum(b for key, b in self.missing.items() if key not in given_elsewhere)


def _gradients(grads: list[tuple[torch.Tensor | None, torch.Tensor]]) -> _Gradients:
    """The (gradient, input) pairs of one backward as :class:`_Gradients`."""
    made: dict[int, int] = {}
    given: set[int] = set()
    missing: dict[int, int] = {}
    for g, t in grads:
        if g is None:
            missing[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
            continue
        given.add(t.untyped_storage().data_ptr())
        key = g.untyped_storage().data_ptr()
        made[key] = max(made.get(key, 0), g.untyped_storage().nbytes(), g.numel() * g.element_size())
    return _Gradients(made, frozenset(given), missing)


def _parameter_gradients(grads, targets, but: frozenset[int] = frozenset()) -> frozenset[int]:
    """Addresses of the parameters' gradients among ``grads`` (returned for ``targets``), but those of the
    parameters whose ``id`` is in ``but``."""
    return frozenset(
        g.untyped_storage().data_ptr() for g, t in zip(grads, targets) if g is not None and isinstance(t, nn.Parameter) and id(t) not in but
    )


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

    returned: dict[int, _Gradients] = {}
    param_grads: dict[int, frozenset[int]] = {}
    param_grads_alone: dict[int, frozenset[int]] = {}
    shared_alone: dict[int, int] = {}
    seed_bytes: dict[int, int] = {}
    users: dict[int, int] = {}  # (id of a parameter -> how many nodes' backwards it gets a gradient from)
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
            returned[i] = _gradients([(g, t) for g, t in zip(grads, targets) if not isinstance(t, nn.Parameter)])
            param_grads[i] = _parameter_gradients(grads, targets)
            for t in targets if outs else ():
                if isinstance(t, nn.Parameter):
                    users[id(t)] = users.get(id(t), 0) + 1
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
            seed_bytes[i] = sum(s.nbytes for s in seeds)
            # (its output too: left alone, with no reader rerun, TrainingGraph.workspace_readers, the node's
            # consumers are done with it, and what the node saved of it goes as its operations' backward
            # ends, a fused group's ReLU's output with the ReLU's)
            del seeds, out
            mark()
            grads = torch.autograd.grad(outs, targets, units, allow_unused=True) if outs and targets else ()
            mark()
            # (a shared parameter's contribution is a graph tensor where it lives: gradients.with_shared_gradients)
            shared = frozenset(p for p, n in users.items() if n > 1)
            param_grads_alone[i] = _parameter_gradients(grads, targets, but=shared)
            shared_alone[i] = sum(g.nbytes for g, t in zip(grads, targets) if g is not None and id(t) in shared)
            del outs, targets, units, grads
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
            found[index[backward_of[name]]] = _transient(pieces[4 * k + 3], param_grads[i])
            elsewhere = frozenset().union(*(r.given for j, r in returned.items() if j != i))
            gradient_bytes[index[backward_of[name]]] = returned[i].bytes_with(elsewhere)
    left_alone: dict[int, int] = {}
    for k, i in enumerate(alone):  # (then pieces per node: its forward and gradient, its backward)
        j = index[backward_of[graph.nodes[i].name]]
        # the simulator counts the node's output (the gradients by input, each storage once, and the shared
        # parameters' contributions, gradients.with_shared_gradients) from the start, where the engine makes
        # them as it goes, once the saved tensors and the incoming gradient that went first have made room:
        # the peak above that, below 0 where it comes after those frees (a block's Linear backward after its
        # dropout's and SiLU's let their saved tensors go)
        peak, _ = _peak(pieces[4 * len(forward_nodes) + 2 * k + 1], param_grads_alone[i])
        counted = min(graph.nodes[j].output_bytes, gradient_bytes[j]) + shared_alone[i]
        # the gradients it receives: the simulator holds each consumer's backward output to this node, the
        # engine sums their parts for this node's output into one as they arrive (a U-Net's skip, an
        # auxiliary head's), which this run's one seed stands for (a consumer's output beyond that part, the
        # gradients of its other inputs, stays counted)
        incoming = [q for q in set(graph.nodes[j].inputs) if graph.nodes[q].is_backward]
        parts = sum(min(graph.nodes[q].output_bytes, gradient_bytes.get(q, graph.nodes[q].output_bytes), seed_bytes[i]) for q in incoming)
        counted += max(0, parts - seed_bytes[i])
        if peak - counted < found[j]:
            left_alone[j] = peak - counted
    return OperationBytes(found, gradient_bytes, left_alone)

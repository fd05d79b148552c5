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
the executor keeps to replay dropout (:func:`rng_reserve_bytes`, ``TrainingGraph.reserved_bytes``), which
:func:`poetlab.solve` keeps free for the whole step: the RAM budget is a budget of the allocator's bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from poetlab.torch.allocations import measure_allocations
from poetlab.torch.kernels import planned_kernels
from poetlab.torch.probes import node_probe, tensors_in

if TYPE_CHECKING:
    from poetlab.torch.trace import TracedStep

__all__ = ["measure_workspaces", "rng_reserve_bytes", "shared_gradient_bytes"]

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


def shared_gradient_bytes(graph) -> int:
    """Bytes of the gradient contributions a step holds for parameters that several nodes use (weight tying,
    a module called twice): autograd keeps each contribution until the last arrives and sums them into
    ``.grad``, from the first of those nodes' backward to the last, in an order the engine picks (not a
    schedule), so they are kept free for the whole step: ``users x`` each such parameter's size."""
    param_names: dict[str, list[str]] = graph.metadata.get("param_names", {})
    sizes: dict[str, int] = graph.metadata.get("param_sizes", {})
    users: dict[str, int] = {}
    for names in param_names.values():
        for q in names:
            users[q] = users.get(q, 0) + 1
    return sum(n * int(sizes.get(q, 0)) for q, n in users.items() if n > 1)


def measure_workspaces(traced: TracedStep) -> dict[int, int]:
    """Graph node index -> its operation's transient workspace in bytes (a backward node's is its forward
    node's backward run). Nodes that compute nothing (inputs) are left out."""
    graph = traced.graph
    forward_nodes = [i for i, node in enumerate(graph.nodes) if not node.is_backward and node.kind != "input"]
    markers = 0

    def mark() -> None:
        nonlocal markers
        torch.empty(_MARKER_BYTES + markers, dtype=torch.uint8)  # (allocated and freed at once)
        markers += 1

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
            del out, outs, targets, seeds, grads
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
    for k, i in enumerate(forward_nodes):  # (pieces per node: before it, its forward, its output's gradient, its backward)
        found[i] = _transient(pieces[4 * k + 1])
        name = graph.nodes[i].name
        if name in backward_of:
            found[index[backward_of[name]]] = _transient(pieces[4 * k + 3])
    return found

"""Which nodes the schedule manages (NOTE [5]) and which first runs go without autograd's graph (NOTE [6]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable

import torch

from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, Schedule
from poetlab.core.schedule import managed_nodes as schedule_managed_nodes
from poetlab.torch.probes import fetch_attr
from poetlab.torch.execute.codegen import outside_inputs
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.execute.state import storage_key

if TYPE_CHECKING:
    from poetlab.torch.execute.codegen import Binding
    from poetlab.torch.execute.layout import StepLayout
    from poetlab.torch.execute.state import NodeState


def managed_nodes(graph: TrainingGraph, schedule: Schedule, binding: Binding) -> tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int]]:
    """(managed, packed, hooked, kept): which nodes need the executor's machinery, found once from the schedule.

    A forward node is *managed* when the schedule does more with it than plain autograd would: it frees
    it while a later operation still reads it (to recompute it or page it back in, or by mistake, which
    strict mode reports), pages or compresses it, or recomputes it. Every other forward node is computed
    once and freed after its last use, which is what PyTorch does by itself: autograd keeps what it saved
    until the backward node that reads it has run, reference counting frees the rest. Such nodes run
    without bookkeeping of their storages, without saved-tensor hooks, and their values are dropped at
    their free (or when the backward pass begins). Those a recompute reads (*kept*) keep their values
    until their free instead: the reference keeps the memory, as the schedule does, and the machinery's
    cost per managed node (saved-tensor hooks on each saved tensor, records, pre-hooks) is not paid for them. *packed* nodes run under the saved-tensor hooks:
    the managed ones and those that read one (so that autograd's reads of managed storages are checked
    and wait for a prefetch). *hooked* backward nodes get the pre-hook that advances the schedule: from
    the first one before whose compute the schedule does something to a managed or kept node, every
    later one. (Not only those: a group without an autograd node
    of its own, an identity shortcut, shares another group's, whose pre-hook then fires later than the
    schedule's order says; the next group's pre-hook catches up.) A schedule that changes nothing in the
    backward pass, checkpoint-all, runs with no pre-hook at all: the machinery's cost follows what the
    schedule asks for, not the model's size. These are the first step's sets; the steps after it use the
    part of them the first step showed to be needed (:meth:`ScheduleExecutor._learn`).
    """
    nodes = graph.nodes
    forward = [not node.is_backward and i not in binding.inputs for i, node in enumerate(nodes)]
    computes: dict[int, list[int]] = {}  # node -> positions of its computes
    for position, op in enumerate(schedule.ops):
        if op.kind is OpKind.COMPUTE:
            computes.setdefault(op.node, []).append(position)
    # (the simulator's rule, which picks a backward node's workspace by it: poetlab.core.schedule.managed_nodes)
    managed = {i for i in schedule_managed_nodes(graph, schedule) if forward[i]}
    kept = {k for i in managed if len(computes.get(i, ())) > 1 for k in nodes[i].inputs if forward[k] and k not in managed}
    packed = managed | {j for j, node in enumerate(nodes) if forward[j] and any(k in managed for k in node.inputs)}
    hooked: set[int] = set()
    started = pending = active = False
    for op in schedule.ops:
        if op.kind is OpKind.COMPUTE and binding.forward_of[op.node] is not None:
            active = active or pending
            if active:
                hooked.add(op.node)
            started, pending = True, False
        elif started and (op.node in managed or op.node in kept):
            pending = True  # (ops before the first backward compute are done by the forward loop)
    return frozenset(managed), frozenset(packed), frozenset(hooked), frozenset(kept)


def graphless_nodes(layout: StepLayout) -> frozenset[int]:
    """The managed forward nodes whose first run builds no autograd graph (:class:`GraphlessRun`): those
    the schedule only recomputes, once, in the backward pass, and that nothing but their own backward node
    reads there.

    Such a node's first run is thrown away whole: the schedule frees all of it (output and saved tensors)
    before any backward node reads it and reruns it before its backward node, the only reader left. Run
    with autograd's graph, its first run saves its tensors (a Python call each, under the saved-tensor
    hooks), has its storages recorded, emptied at the free and refilled from the rerun; the encoder's
    transformer layer saves 29, most of the executor's own time on that model (docs/benchmarks.md). Run with grad off inside one autograd function, it saves nothing,
    and the rerun's own graph is what autograd runs backward.

    A node qualifies when: it has generated code (:func:`compile_group`) and a backward node; the
    schedule computes it once in the forward pass and once more in the backward pass, and otherwise only
    frees it (no paging, no compression); among the backward nodes only its own reads it; no other node's
    rerun reads it (a rerun reads the first run's values); and none of its parameters or buffers is any
    other node's (its rerun's engine run accumulates its parameters' gradients by itself: a parameter read
    elsewhere too could add up in another order than a plain step's)."""
    schedule, binding, nodes = layout.schedule, layout.binding, layout.graph.nodes
    start = layout.backward_start
    positions: dict[int, list[tuple[int, OpKind]]] = {}
    for position, op in enumerate(schedule.ops):
        positions.setdefault(op.node, []).append((position, op.kind))
    backward_readers: dict[int, set[int]] = {}
    for j, node in enumerate(nodes):
        if binding.forward_of[j] is not None:
            for i in node.inputs:
                backward_readers.setdefault(i, set()).add(j)
    rerun_inputs = {k for j, n in layout.n_computes.items() if n > 1 for k in nodes[j].inputs}

    def constants(i: int) -> set[int]:
        found: list[torch.Tensor] = []
        members = binding.members[i]
        for m in [*members, *(d for d in outside_inputs(members).values() if d.op == "get_attr")]:
            if m.op == "call_module":
                module = layout.modules[m.target]
                found += [*module.parameters(), *module.buffers()]
            elif m.op == "get_attr":
                value = fetch_attr(layout.gm, str(m.target))
                if isinstance(value, torch.Tensor):
                    found.append(value)
        return {id(t) for t in found}

    candidates = []
    for i in layout.managed:
        j = binding.backward_of_forward.get(i)
        ops = positions.get(i, [])
        computes = [p for p, kind in ops if kind is OpKind.COMPUTE]
        if (
            j is None or layout.compiled[i] is None or i == binding.loss or i in rerun_inputs
            or any(kind not in (OpKind.COMPUTE, OpKind.FREE) for _, kind in ops)
            or len(computes) != 2 or not computes[0] < start <= computes[1]
            or not backward_readers.get(i, set()) <= {j}
        ):
            continue
        candidates.append(i)
    if not candidates:
        return frozenset()
    held = {i: constants(i) for i in range(len(nodes)) if binding.forward_of[i] is None}
    owners: dict[int, set[int]] = {}
    for i, keys in held.items():
        for key in keys:
            owners.setdefault(key, set()).add(i)
    return frozenset(i for i in candidates if all(owners[key] == {i} for key in held[i]))


class GraphlessRun(torch.autograd.Function):
    """A graphless node's first run (:func:`graphless_nodes`): its generated code with grad off (an
    autograd function's forward runs so), its values this function's outputs. Its backward runs autograd's
    engine on the graph the node's rerun built (:meth:`StepRun._recompute` leaves it, with its detached inputs,
    in the node's state): the rerun's parameters get their gradients there, as in a plain step, and the
    gradients of its inputs are this function's. ``trigger`` is a 0-d tensor that requires grad, so that
    autograd records the function even where no input requires grad (a node reading only the batch)."""

    @staticmethod
    def forward(ctx, state: "NodeState", run: Callable[..., tuple[object, ...]], trigger: torch.Tensor, *deps: object) -> tuple[object, ...]:  # type: ignore[override]
        ctx.state = state
        results = run(*deps)
        inputs = {storage_key(d.untyped_storage()) for d in deps if isinstance(d, torch.Tensor)}
        # (an output that is an input or a view of one would be marked a view by autograd: a copy instead)
        results = tuple(r.clone() if isinstance(r, torch.Tensor) and storage_key(r.untyped_storage()) in inputs else r for r in results)
        fixed = [r for r in results if isinstance(r, torch.Tensor) and not (r.is_floating_point() or r.is_complex())]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return results

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[object, ...]:  # type: ignore[override]
        state: NodeState = ctx.state
        rerun, state.rerun = state.rerun, None
        if rerun is None:
            raise ExecutionError("autograd reached a node run without its graph before the schedule recomputed it; plan on the traced graph")
        results, inputs, detached = rerun
        pairs = [(r, g) for r, g in zip(results, grads, strict=True) if isinstance(r, torch.Tensor) and r.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
        return (None, None, None, *(d.grad if own and isinstance(d, torch.Tensor) else None for d, own in zip(inputs, detached, strict=True)))


def detached_aliases(value: object) -> object:
    """Detached aliases of the tensors in ``value``, requiring grad where the originals did, so that a
    rerun saves the same tensors for backward as the first run did."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(detached_aliases(v) for v in value)
    return value

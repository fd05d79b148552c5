"""The fast path of the steps after the first (NOTE [5], [8]): the forward pass as generated segments, the bookkeeping replayed in one loop, last frees handed over to autograd. See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from poetlab.core.schedule import Op, OpKind
from poetlab.torch.execute.codegen import PLAIN_FX_OPS, outside_inputs, generated_module
from poetlab.torch.execute.state import COMPRESSION_OPS

if TYPE_CHECKING:
    from poetlab.torch.execute.layout import StepLayout, StepPlan


@dataclass(frozen=True)
class Segment:
    """A run of the forward pass's schedule operations, ``start`` up to ``end`` (exclusive), carried out by
    one generated function: the first computes' fx nodes, in the schedule's order, and between them calls
    into the step for the operations that need its work. The executor's per-node work (one Python call
    per operation, per fx node and per dependency) then happens once for the whole run:

    - a compute of a node without saved-tensor hooks is its fx nodes, and nothing else (its bookkeeping
      is an event); a *packed* node's fx nodes run between ``run.begin`` and ``run.finish_in_segment``
      (once learnt, often the lean ``run.begin_owned`` and ``run.finish_owned``), which switch the hooks
      on and record what the node owns, as :meth:`StepRun._first_compute` does;
    - frees of unmanaged nodes are events; frees of managed or kept nodes are ``run.free(node)``,
      page-outs and compressions ``run.do_at(position)``; the events since the last call are replayed
      (``run.replay``) before each call, so that the planned bytes are counted in the schedule's order;
    - unmanaged nodes whose storages a packed node of the segment may save or view are made known by key
      (``run.track``) as soon as they have run, unless that node finds its storages where the first step
      did (:meth:`ScheduleExecutor._learn`); the autograd nodes that get the pre-hooks driving the backward
      pass are collected as the nodes they hook have run (by the code itself once the first step has
      shown that their values are tensors, else ``run.hook_backward``), and hooked after the run;
    - the parameters and buffers read as attributes (``get_attr``) are the code's own.

    ``run(env, run)`` pops the values of ``deps`` from the list ``env`` (last first) and returns those of
    ``outputs``: the fx nodes the step reads after the segment (the model's later nodes, or a recompute:
    managed and kept nodes). The generated code drops every other value after its last use, as the
    model's own forward would; a node the segment frees without computing it is handed over (dropped from
    the step's values before the call), so that it too goes at its last use. ``events`` replays the
    bookkeeping after the last call (:func:`_bookkeeping`)."""

    start: int
    end: int
    deps: tuple[fx.Node, ...]
    freed_before: tuple[int, ...]
    outputs: tuple[str, ...]
    escaping: tuple[tuple[int, tuple[str, ...]], ...]  # (node, its fx names in outputs), for storage keys
    events: tuple[tuple[int, int], ...]
    run: Callable[..., tuple[object, ...]]


_FREE, COMPUTE, SKIPPED_FREE, RECOMPUTED_BATCH = 0, 1, 2, 3


def _bookkeeping(layout: StepLayout, handed_frees: frozenset[int], op: Op, position: int) -> tuple[int, int] | None:
    """``op`` (at ``position``) as an event ``(node, what)`` for :meth:`StepRun.replay`, when it is one for
    which the step has nothing to do but count: a compute (of a node whose work is done elsewhere: a
    segment's, a gradient autograd computes; the caller decides), a "recompute" of the caller's batch
    (which never left), a free of an unmanaged node, a gradient or the batch (the last counted as
    skipped, as :meth:`StepRun._do` does), or a free whose memory autograd gives back by itself (a node handed
    over: :func:`handovers_of`). None when the operation needs real work."""
    i, inputs = op.node, layout.binding.inputs
    if op.kind is OpKind.COMPUTE:
        return (i, RECOMPUTED_BATCH if i in inputs and layout.computed_at[i] != position else COMPUTE)
    if op.kind is OpKind.FREE and i in inputs:
        return (i, SKIPPED_FREE)
    if op.kind is OpKind.FREE and ((i not in layout.managed and i not in layout.kept) or position in handed_frees):
        return (i, _FREE)
    return None


def backward_runs_of(layout: StepLayout, handed_frees: frozenset[int]) -> tuple[tuple[tuple[int, int] | None, ...], tuple[int, ...]]:
    """(events, ends): for each position of the schedule from the backward pass's first compute on, its
    operation as an event of :meth:`StepRun.replay` when it is bookkeeping only (:func:`_bookkeeping`: a
    gradient autograd computes, once; a free of a gradient, of the batch, or of an unmanaged node the
    forward pass computed), and the end of the run of such operations that starts there (the position
    itself when it needs work). The backward pass, driven from autograd's pre-hooks, replays each run at
    once rather than operation by operation: checkpoint-all's whole backward pass is one run, done after
    ``loss.backward()``."""
    ops, binding, n_computes = layout.schedule.ops, layout.binding, layout.n_computes
    start = layout.backward_start
    forward_computed = {op.node for op in ops[:start] if op.kind is OpKind.COMPUTE}
    events: list[tuple[int, int] | None] = [None] * len(ops)
    for position in range(start, len(ops)):
        op = ops[position]
        if op.kind is OpKind.COMPUTE:
            bookkeeping = (binding.forward_of[op.node] is not None and n_computes[op.node] == 1) or op.node in binding.inputs
        else:  # (a free of an unmanaged node computed in the backward pass drops its values: _do)
            bookkeeping = op.kind is OpKind.FREE and (binding.forward_of[op.node] is not None or op.node in forward_computed)
        if bookkeeping:
            events[position] = _bookkeeping(layout, handed_frees, op, position)
    ends = list(range(len(ops) + 1))
    for position in range(len(ops) - 1, start - 1, -1):
        if events[position] is not None:
            ends[position] = ends[position + 1]
    return tuple(events), tuple(ends)


def handovers_of(layout: StepLayout) -> dict[int, tuple[int, int]]:
    """The nodes whose last free the step can leave to autograd, each with ``(use, free)``: the position
    after whose operation the step has no more use for the node, and that of the free.

    A managed or kept node whose last operation is a free in the backward pass, after the step's last use
    of it there (its own rerun or page-in, or the rerun of a node that reads it), is from then on held by
    autograd alone, in what it saved: autograd lets go of it as the last backward node that reads it has
    run, which the schedule's free follows. Once the step drops its own references right after that use
    (:meth:`StepRun._hand_over`), the free is bookkeeping (:func:`_bookkeeping`), and a backward pre-hook
    that had only such frees to do is not needed any more (:meth:`ScheduleExecutor._learn`). Nodes that
    are compressed are left out (their copies are the step's to drop)."""
    ops, binding, nodes = layout.schedule.ops, layout.binding, layout.graph.nodes
    start = layout.backward_start
    last_use: dict[int, int] = {}
    last_op: dict[int, tuple[int, Op]] = {}
    compressed: set[int] = set()
    for position, op in enumerate(ops):
        i = op.node
        if binding.forward_of[i] is not None:
            continue
        if op.kind in COMPRESSION_OPS:
            compressed.add(i)
        last_op[i] = (position, op)
        if op.kind is not OpKind.FREE:
            last_use[i] = position
        if op.kind is OpKind.COMPUTE:  # (a forward node's compute reads its inputs: the step's use of them)
            for k in nodes[i].inputs:
                last_use[k] = position
    found = {}
    for k in (layout.managed | layout.kept) - binding.inputs - compressed:
        free, op = last_op[k]
        use = last_use.get(k, -1)
        if op.kind is OpKind.FREE and start <= use < free:
            found[k] = (use, free)
    return found


#: what a segment does by calling into the step (:meth:`StepRun._do`): none of it takes a node out of RAM
#: but a free, after which the segment's code reads the node no more
_SEGMENT_CALLS = frozenset({OpKind.FREE, OpKind.PAGE_OUT, OpKind.COMPRESS, OpKind.FREE_COMPRESSED})


def segments_of(layout: StepLayout, plan: StepPlan) -> dict[int, Segment]:
    """The forward pass's runs of two first computes or more (:class:`Segment`), by their first position
    in the schedule. A run ends before an operation its code cannot do (a recompute, a page-in, the
    batch's first compute, the loss's while it is packed) and before a compute that reads a node the run
    has freed: that compute starts the next run, whose dependencies are looked up (and checked) by the step."""
    ops, binding, nodes = layout.schedule.ops, layout.binding, layout.graph.nodes

    def forward(i: int) -> bool:
        return binding.forward_of[i] is None and i not in binding.inputs and i != binding.loss

    def computable(position: int, op: Op) -> bool:  # (a first compute: recomputes are the step's)
        i = op.node
        if op.kind is not OpKind.COMPUTE or layout.computed_at.get(i) != position:
            return False
        if i == binding.loss:  # (run.compute_loss: not while its reads are checked)
            return i not in plan.packed and i not in layout.managed
        return forward(i) and all(m.op in PLAIN_FX_OPS for m in binding.members[i])

    runs: list[tuple[int, int]] = []
    start, freed = None, set()
    for position, op in enumerate(ops):
        if op.kind is OpKind.COMPUTE and binding.forward_of[op.node] is not None:
            break  # the backward pass: autograd's engine
        if computable(position, op):
            if start is not None and freed & set(nodes[op.node].inputs):
                runs.append((start, position))
                start, freed = None, set()
            start = position if start is None else start
            continue
        if (op.kind in (OpKind.FREE, OpKind.COMPUTE) and op.node in binding.inputs and layout.computed_at[op.node] < position) or (op.kind in _SEGMENT_CALLS and forward(op.node)):
            start = position if start is None else start
            if op.kind is OpKind.FREE:
                freed.add(op.node)
            elif op.kind is OpKind.COMPUTE:
                freed.discard(op.node)  # (the batch, back in RAM)
            continue
        if start is not None:
            runs.append((start, position))
        start, freed = None, set()
    else:
        position = len(ops)
    if start is not None:
        runs.append((start, position))
    segments = {}
    for start, end in runs:
        if sum(op.kind is OpKind.COMPUTE and op.node not in binding.inputs for op in ops[start:end]) >= 2:
            segments[start] = _compile_segment(layout, plan, start, end)
    return segments


def _compile_segment(layout: StepLayout, plan: StepPlan, start: int, end: int) -> Segment:
    """The :class:`Segment` of operations ``start:end``."""
    binding, nodes, packed = layout.binding, layout.graph.nodes, plan.packed
    ops = layout.schedule.ops[start:end]
    computed = [op.node for op in ops if op.kind is OpKind.COMPUTE and op.node not in binding.inputs]
    in_segment = set(computed)
    freed = {op.node for op in ops if op.kind is OpKind.FREE}
    # (an unmanaged base's free lets go of its views' values too: they hold its storage, StepLayout.views_freed_with)
    freed |= {v for b in list(freed) for v in layout.views_freed_with.get(b, ())}
    members = [m for i in computed for m in binding.members[i]]
    inside = {m.name for m in members}
    deps = outside_inputs(members)
    if binding.loss in in_segment:  # (the loss reads the model's outputs: fx nodes, no members of its own)
        read: list[fx.Node] = []
        fx.node.map_arg(binding.output_arg, read.append)
        for d in read:
            if d.name not in inside:
                deps.setdefault(d.name, d)
    # unmanaged nodes of the segment a packed one reads: known by key at once (their frees are calls, to
    # forget them); not for a packed node that finds its storages where the first step did (_learn)
    tracked = {k for i in computed if i in packed and i not in plan.owned_sources for k in nodes[i].inputs} & in_segment - packed
    keep = {i for i in computed if i in layout.managed or (i not in freed and i in layout.kept)}
    outputs = [
        m.name for i in computed for m in binding.members[i]
        if m.name in layout.external[i] and (i in keep or (i not in freed and any(u.name not in inside for u in m.users)))
    ]
    # the parameters and buffers it reads as attributes, in its own code (not looked up by the step)
    attributes = [d for d in deps.values() if d.op == "get_attr" and d.name not in layout.group_of]
    looked_up = [d for d in deps.values() if d not in attributes]
    sub = fx.Graph()
    env_list, run = sub.placeholder("env"), sub.placeholder("run")
    env: dict[fx.Node, fx.Node] = {d: sub.node_copy(d) for d in attributes}
    env.update({d: sub.call_method("pop", (env_list,)) for d in reversed(looked_up)})
    events: list[tuple[int, int]] = []
    pending_hooks: fx.Node | None = None

    def flush() -> None:  # (the bookkeeping before the next call, in the schedule's order)
        if events:
            sub.call_method("replay", (run, tuple(events)))
            events.clear()

    def call(method: str, *args: object) -> None:
        flush()
        sub.call_method(method, (run, *args))

    for position, op in enumerate(ops, start):
        i = op.node
        if op.kind is not OpKind.COMPUTE or i in binding.inputs:  # (the batch is only "recomputed" here)
            # (a graphless node's free is a call: it lets go of its first run's values, StepRun.free)
            bookkeeping = op.kind is OpKind.COMPUTE or (op.kind is OpKind.FREE and (i not in in_segment or i not in packed | tracked | layout.graphless))
            event = _bookkeeping(layout, plan.handed_frees, op, position) if bookkeeping else None
            if event is None and op.kind is OpKind.FREE and i not in binding.inputs:
                call("free", i)  # (what _do does for it)
            elif event is None:
                call("do_at", position)
            else:
                events.append(event)
            continue
        # (a packed node that finds its storages where the first step did, nothing tracked: the lean pair;
        # without the saved-tensor hooks where its fx values and their autograd nodes show them all)
        owned = i in plan.owned_places and not plan.tracking
        places = plan.hookless[i][0] if owned and i in plan.hookless else None
        if i == binding.loss:
            call("compute_loss", i, fx.node.map_arg(binding.output_arg, lambda n: env[n]))
            continue
        if places is not None:
            flush()
        elif i in packed:
            call("begin_owned", i) if owned else call("begin", i, True)
        if i in layout.graphless:  # (its values are those of one call: StepRun.graphless_in_segment)
            compiled = layout.compiled[i]
            assert compiled is not None
            results = sub.call_method("graphless_in_segment", (run, i, *[env[d] for d in compiled.deps]))
            by_name = {m.name: m for m in binding.members[i]}
            for k, name in enumerate(layout.external[i]):
                env[by_name[name]] = sub.call_function(operator.getitem, (results, k))
        else:
            for m in binding.members[i]:
                env[m] = sub.node_copy(m, lambda n: env[n])
        external = [env[m] for m in binding.members[i] if m.name in layout.external[i]]
        if places is not None:
            by_name = {m.name: env[m] for m in binding.members[i]}
            fns = {name: sub.call_function(getattr, (by_name[name], "grad_fn")) for name in dict.fromkeys(name for name, attr in places if attr)}
            found = tuple(by_name[name] if attr is None else sub.call_function(getattr, (fns[name], attr)) for name, attr in places)
            sub.call_method("finish_hookless", (run, i, found))
        elif i in packed:
            if owned:
                sub.call_method("finish_owned", (run, i, external))
            else:  # (the first step also shows its fx values, to find its storages without hooks: finish)
                members_now = tuple(env[m] for m in binding.members[i]) if not plan.learnt and i in layout.managed else None
                sub.call_method("finish_in_segment", (run, i, external, members_now))
                continue
        else:
            events.append((i, COMPUTE))
            if i in tracked:
                sub.call_method("track", (run, i, external))
        j = binding.backward_of_forward.get(i)
        if j in plan.hook_at and plan.tensor_valued.get(i):
            # its outputs' autograd nodes collected here, hooked after the segment (StepRun._hook_pending)
            if pending_hooks is None:
                pending_hooks = sub.call_function(getattr, (run, "pending_hooks"))
            fns = tuple(sub.call_function(getattr, (v, "grad_fn")) for v in external)
            sub.call_method("append", (pending_hooks, (j, fns)))
        elif j in plan.hook_at:
            sub.call_method("hook_backward", (run, i, external, owned))  # (a lean node's deferred: finish_owned)
    sub.output(tuple(env[m] for m in members if m.name in outputs))
    module = generated_module(layout.gm, sub)
    return Segment(
        start=start,
        end=end,
        deps=tuple(looked_up),
        freed_before=tuple(sorted(freed - in_segment - layout.managed - binding.inputs)),
        outputs=tuple(outputs),
        escaping=tuple(
            (i, names) for i in computed
            if plan.tracking and i not in packed and i not in tracked and (names := tuple(m.name for m in binding.members[i] if m.name in outputs))
        ),
        events=tuple(events),
        run=module.forward,
    )

"""What a schedule asks of each node of a traced module (:class:`StepLayout`, found once per executor) and
what the steps do beyond the reference (:class:`StepPlan`, learnt from the first step: NOTE [8]). The step
reads both; nothing changes them (the executor replaces its plan once it has learnt). See docs/executor.md."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import fx, nn

from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, Schedule
from poetlab.torch.execute.codegen import Binding, CompiledGroup, bind_graph, compile_group, stands_in
from poetlab.torch.execute.graphless import graphless_nodes, managed_nodes
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.execute.segments import Segment, backward_runs_of, handovers_of, segments_of
from poetlab.torch.fx_trace import traced_module


@dataclass(frozen=True)
class StepLayout:
    """A schedule bound to a traced module: what every step of it does to each node.

    - ``gm``: the fx trace (as :mod:`poetlab.torch.trace` traced it), ``modules`` its submodules by name,
      ``binding`` the graph's nodes as its fx nodes; ``placeholders`` the trace's inputs, ``batch_of`` each
      input node's fx names and the positions of the caller's inputs they take;
    - ``group_of``: the node each fx name belongs to; ``external``: each node's fx names read outside it
      (its values, kept for the whole step; the last one is its output);
    - ``compiled``: each node's generated code (None where it has none: the loss); ``rerun_code``: the
      reruns', with BatchNorm modules through their stand-ins (NOTE [3]);
    - ``n_computes``, ``computed_at``: how often the schedule computes each node, and where first;
      ``backward_start``: the position of the first backward compute (the schedule's end if none);
    - ``managed``, ``packed``, ``hooked``, ``kept``: :func:`managed_nodes`, less the ``graphless`` nodes
      (:func:`graphless_nodes`), whose first run builds no autograd graph (NOTE [6]);
      ``rerun_in_backward``: the forward nodes rerun after the first gradient's compute;
    - ``handover_candidates``: the nodes whose last free a learnt step may leave to autograd
      (:func:`handovers_of`); ``output_bytes``: each node's planned bytes; ``has_pageouts``: whether a step
      needs a paging directory; ``bases``: per node, the nodes whose storages its values view
      (``metadata["view_of"]``: it holds none of them, they go with their owners); ``views_freed_with``: per
      unmanaged base, its unmanaged views, whose values go at its free (:func:`_views_freed_with`)."""

    graph: TrainingGraph
    schedule: Schedule
    gm: fx.GraphModule
    binding: Binding
    modules: dict[str, nn.Module]
    placeholders: tuple[fx.Node, ...]
    batch_of: dict[int, tuple[tuple[str, int], ...]]
    group_of: dict[str, int]
    external: tuple[tuple[str, ...], ...]
    compiled: tuple[CompiledGroup | None, ...]
    rerun_code: tuple[CompiledGroup | None, ...]
    n_computes: dict[int, int]
    computed_at: dict[int, int]
    backward_start: int
    managed: frozenset[int]
    packed: frozenset[int]
    hooked: frozenset[int]
    kept: frozenset[int]
    rerun_in_backward: frozenset[int]
    output_bytes: tuple[int, ...]
    has_pageouts: bool
    graphless: frozenset[int] = frozenset()
    bases: dict[int, frozenset[int]] = field(default_factory=dict)
    handover_candidates: dict[int, tuple[int, int]] = field(default_factory=dict)
    views_freed_with: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepPlan:
    """What a step does beyond the reference loop of :class:`~poetlab.torch.execute.step.StepRun`, from
    what the first step that succeeded showed (NOTE [8]; ``learnt`` once it has; the executor's
    ``_learn`` says why each is safe):

    - ``hook_at``: the backward nodes whose autograd nodes get the pre-hook that advances the schedule;
      ``packed``: the forward nodes that run under the saved-tensor hooks;
    - ``unchecked_reads``: autograd's reads of saved tensors go unchecked; ``owned_sources`` (by
      :class:`~poetlab.torch.execute.state.StorageRecord` source) and ``owned_places`` (from its saved
      tensors?, index there or among its values, tensor index): where each managed node's storages are
      found, by position; ``hookless``: the managed nodes whose storages are all among their fx values and
      what those values' autograd nodes saved (found without the saved-tensor hooks), and how many tensors
      their first run saved; ``tracking``: whether unmanaged nodes' storages are made known by key;
    - ``handover``: the nodes handed over to autograd after each position, ``handed_frees`` the positions of
      their last frees (bookkeeping from then on); ``events``, ``bookkeeping_end``: the backward pass's
      runs of bookkeeping (:func:`backward_runs_of`);
    - ``constants_met``: the parameters and buffers whose storages a step looks up (None: all of them);
      ``tensor_valued``: whether each hooked forward node's values are tensors (the segments' code then
      collects their autograd nodes itself);
    - ``segments``: the forward pass's runs of operations as generated functions, by first position (none
      for the reference step: every operation through the reference loop)."""

    hook_at: frozenset[int]
    packed: frozenset[int]
    events: tuple[tuple[int, int] | None, ...]
    bookkeeping_end: tuple[int, ...]
    learnt: bool = False
    unchecked_reads: bool = False
    owned_sources: dict[int, tuple[tuple, ...]] = field(default_factory=dict)
    owned_places: dict[int, tuple[tuple[bool, int, int], ...]] = field(default_factory=dict)
    hookless: dict[int, tuple[tuple[tuple[str, str | None], ...], int]] = field(default_factory=dict)
    tracking: bool = True
    handover: dict[int, tuple[int, ...]] = field(default_factory=dict)
    handed_frees: frozenset[int] = frozenset()
    constants_met: tuple[torch.Tensor, ...] | None = None
    tensor_valued: dict[int, bool] = field(default_factory=dict)
    segments: dict[int, Segment] = field(default_factory=dict)


def step_layout(module: nn.Module, graph: TrainingGraph, schedule: Schedule) -> StepLayout:
    """The :class:`StepLayout` of ``schedule`` on ``module`` (traced as ``graph``)."""
    gm = traced_module(module, graph.metadata)  # (as poetlab.torch.trace traced it: its leaves, concrete shapes)
    binding = bind_graph(graph, gm)
    placeholders = tuple(n for n in gm.graph.nodes if n.op == "placeholder")
    # each input node's fx names and the positions of the caller's inputs they take (a traced graph's input
    # nodes are one placeholder each: poetlab.torch.trace)
    batch_of: dict[int, tuple[tuple[str, int], ...]] = {}
    for i in binding.inputs:
        members = binding.members[i]
        if any(m.op != "placeholder" for m in members):
            raise ExecutionError(f"input node {graph.nodes[i].name} of graph {graph.name!r} computes more than a placeholder; trace the module again")
        batch_of[i] = tuple((m.name, placeholders.index(m)) for m in members)
    external: list[tuple[str, ...]] = []
    for ms in binding.members:
        names = {m.name for m in ms}
        ext = [m.name for m in ms if any(u.name not in names for u in m.users)]
        if ms and ms[-1].name not in ext:
            ext.append(ms[-1].name)
        external.append(tuple(ext))
    compiled = [
        compile_group(gm, ms, ext) if i != binding.loss else None
        for i, (ms, ext) in enumerate(zip(binding.members, external, strict=True))
    ]
    n_computes: dict[int, int] = {}
    for op in schedule.ops:
        if op.kind is OpKind.COMPUTE:
            n_computes[op.node] = n_computes.get(op.node, 0) + 1
    rerun_code = list(compiled)
    for i, n in n_computes.items():
        members = binding.members[i]
        if n > 1 and compiled[i] is not None and any(stands_in(gm, m) for m in members):
            rerun_code[i] = compile_group(gm, members, external[i], rerun=True)
    managed, packed, hooked, kept = managed_nodes(graph, schedule, binding)
    backward_start = next(
        (p for p, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and binding.forward_of[op.node] is not None), len(schedule.ops))
    layout = StepLayout(
        graph=graph,
        schedule=schedule,
        gm=gm,
        binding=binding,
        modules=dict(gm.named_modules()),
        placeholders=placeholders,
        batch_of=batch_of,
        group_of={m.name: i for i, ms in enumerate(binding.members) for m in ms},
        external=tuple(external),
        compiled=tuple(compiled),
        rerun_code=tuple(rerun_code),
        n_computes=n_computes,
        computed_at={op.node: p for p, op in reversed(list(enumerate(schedule.ops))) if op.kind is OpKind.COMPUTE},
        backward_start=backward_start,
        managed=managed,
        packed=packed,
        hooked=hooked,
        kept=kept,
        rerun_in_backward=frozenset(
            op.node for op in schedule.ops[backward_start:]
            if op.kind is OpKind.COMPUTE and binding.forward_of[op.node] is None and op.node not in binding.inputs
        ),
        output_bytes=tuple(node.output_bytes for node in graph.nodes),
        has_pageouts=any(op.kind is OpKind.PAGE_OUT for op in schedule.ops),
        bases=graph.view_bases,
    )
    # the managed nodes whose first run builds no autograd graph: from then on they are no storages of the
    # step's (not managed, nothing packed for them); their reruns and backward pre-hooks stay (hooked, kept)
    graphless = graphless_nodes(layout)
    if graphless:
        managed = managed - graphless
        packed = managed | {j for j, node in enumerate(graph.nodes) if j in packed and any(k in managed for k in node.inputs)}
        layout = replace(layout, graphless=graphless, managed=managed, packed=packed)
    return replace(layout, handover_candidates=handovers_of(layout), views_freed_with=_views_freed_with(layout))


def _views_freed_with(layout: StepLayout) -> dict[int, tuple[int, ...]]:
    """Per unmanaged forward base, its views that are neither managed nor graphless: their values go at the
    base's free. A view owns no bytes (``metadata["view_of"]``), so a schedule may hold one past its base's
    free at no cost (the simulator's count and the MILP's); but its value keeps the base's storage alive,
    which an unmanaged base's free (dropping the base's own values) does not empty. Nothing reads the view
    after that free: whatever reads a view reads its base, which an unmanaged node's free follows (its last
    use). (A managed base's free empties its storages: its views then hold no bytes.) Seen on nanoGPT under a
    schedule that kept q, k and v to the end of the forward pass: both blocks' projections stayed, 24.6 KB
    above the simulated peak."""
    out: dict[int, list[int]] = {}
    skip = layout.managed | layout.graphless
    for v, bases in layout.bases.items():
        if v in skip or layout.binding.forward_of[v] is not None or v in layout.binding.inputs:
            continue
        for b in bases:
            if b not in skip and layout.binding.forward_of[b] is None and b not in layout.binding.inputs:
                out.setdefault(b, []).append(v)
    return {b: tuple(sorted(vs)) for b, vs in out.items()}


def first_plan(layout: StepLayout, fast: bool = True) -> StepPlan:
    """The plan of a step before any has succeeded: every pre-hook and saved-tensor hook on, every read
    checked; the forward pass as generated segments where ``fast``, else none (the reference step)."""
    events, ends = backward_runs_of(layout, frozenset())
    plan = StepPlan(hook_at=layout.hooked, packed=layout.packed, events=events, bookkeeping_end=ends)
    return replace(plan, segments=segments_of(layout, plan)) if fast else plan


def node_buffers(layout: StepLayout, i: int) -> list[torch.Tensor]:
    """The buffers of the modules forward node ``i``'s rerun calls (its BatchNorm modules' stand-ins write
    none of theirs: :class:`~poetlab.torch.execute.codegen.RerunBatchNorm`): what a rerun would update a
    second time."""
    code = layout.rerun_code[i]
    stand_ins = code.stand_ins if code is not None else frozenset()
    modules = [layout.modules[m.target] for m in layout.binding.members[i] if m.op == "call_module" and m.target not in stand_ins]
    return [b for mod in modules for b in mod.buffers() if b.numel()]

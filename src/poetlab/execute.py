"""``poetlab.execute``: run one training step of a real ``nn.Module`` exactly as a :class:`Schedule` says.

The schedule's operations (compute, free, page out, page in; :mod:`poetlab.schedule`) are carried out
on the tensors of a graph traced by :func:`poetlab.trace`, whose forward nodes are groups of ``torch.fx``
nodes and whose backward nodes are autograd's own backward of those groups. Nothing of the backward is
written by hand, so any traced model runs:

- **The unit is a storage.** A forward node *owns* the storages it allocates that outlive it: its output
  and whatever autograd saves while it runs that no earlier node produced (a dropout mask, BatchNorm's
  batch statistics, a transformer layer's attention): exactly the bytes the trace charges to the node.
- **free** resizes those storages to zero bytes: the memory goes back to the allocator while every
  tensor object (the output autograd links to, the saved copies autograd holds) stays in place.
  **page out** writes the storages' bytes to files (:mod:`poetlab.paging`), **page in** resizes them back
  and reads the bytes in, in place. **compute** of a node already computed (a recompute) reruns its fx
  nodes on detached aliases of its inputs and swaps the fresh storages' memory into the emptied ones
  (``UntypedStorage._swap_data_ptr_``: no copy, no second buffer); the same RNG
  state (saved before the node's first run, only for nodes that draw random numbers: dropout) and the
  same buffers make the recomputed bytes equal the first ones. A rerun calls BatchNorm through a stand-in
  that normalizes with the same batch statistics and leaves the module's running statistics to the first
  run (:class:`_RerunBatchNorm`); other modules that write buffers get theirs put back or reset
  (:class:`_RerunBuffers`), so that the buffers end a step as a plain step leaves them.
- **compress** keeps a bitmap-compressed copy of each of the node's storages in RAM (the lossless format of
  :mod:`poetlab.techniques.bittrain`: one bit per element, then the non-zero elements, taken bit pattern
  by bit pattern); the dense bytes go when the schedule frees the node, as the simulator counts them.
  **decompress** resizes the emptied storages back and writes the dense bytes into them, in place, so
  autograd's saved tensors see exactly the bytes they saved; **free compressed** drops the copy.
- **Autograd's saved tensors** go through ``torch.autograd.graph.saved_tensors_hooks``: packing records
  which node owns each saved storage (and detaches it, so no reference cycle forms); unpacking checks
  that the owner is in RAM as the schedule promised (waiting for a prefetched page-in if need be).
- **The backward pass is autograd's engine** (``loss.backward()``). A pre-hook on the autograd node of
  forward node *g*'s output advances the schedule up to the compute of *g*'s backward node, performing
  the frees, page-outs, page-ins and recomputes that come before it (after the first step, only where
  there are some: the next pre-hook, or the end of the backward pass, replays the bookkeeping between).
  CPU autograd runs nodes in decreasing creation order, which is the reverse forward order the trace
  gives backward nodes.
  The caller's ``.grad`` are set aside during the step and accumulated with the new ones only after
  the whole step succeeded, so a failing step leaves parameters, gradients and BatchNorm buffers as
  they were.

**Only what the schedule changes is managed.** A forward node that the schedule computes once and frees
after its last use is what plain PyTorch does by itself (autograd keeps what it saved until the backward
node that reads it has run; reference counting frees the rest), so such nodes run without storage
records, saved-tensor hooks or backward pre-hooks, and the executor only drops its own references at
their free (the inputs of a recompute at theirs: the reference keeps them, as the schedule does). The
machinery (records, hooks, the pre-hooks that advance the schedule) is switched on for the nodes the
schedule frees early, pages, compresses or recomputes, and the nodes that read them
(``_managed_nodes``). The forward pass runs as ``torch.fx`` generated functions (:class:`_Segment`) that
drop each value after its last use as the model's own forward would, with the first runs of managed
nodes between calls that switch the saved-tensor hooks on and record what they own, and calls for the
operations that need the step's work (a free of a managed node, a page-out); the bookkeeping of the
operations that need none (frees of unmanaged nodes, the gradients autograd computes) is replayed in
one loop, in the forward and the backward pass alike. The first step that succeeds shows which
backward nodes' pre-hooks have work to do and which readers of managed nodes need their reads checked;
the steps after it hook and check only those, and leave the last free of a node nobody else holds to
autograd once the step has no more use for it (:func:`_handovers`), so that the pre-hooks that only
freed go too (:meth:`ScheduleExecutor._learn`). The machinery's cost
then follows what the schedule asks for rather than the model's size: a checkpoint-all schedule runs at a
plain step's speed (within the measurement noise of a few percent, ``benchmarks/bench_execute.py``),
and each node the schedule does manage costs tens of microseconds of Python (hooks on each tensor
autograd saves, records).

**Nodes that are only recomputed run first without autograd's graph.** A node that the schedule frees
whole in the forward pass, recomputes once in the backward pass and that nothing but its own backward node
reads there (:func:`_graphless_nodes`: the encoder's transformer layer, ResNet's shortcut convolutions)
throws its first run away entirely. It runs that first run with grad off inside one autograd function
(:class:`_GraphlessRun`): nothing saved, no saved-tensor hook, no storage recorded, emptied or refilled;
the rerun keeps its own graph, and the function's backward runs autograd's engine on it (the rerun's
parameters get their gradients there, as in a plain step). It is ``torch.utils.checkpoint``'s reentrant
scheme, applied where the schedule's operations on the node allow it, and such a node is none of the
step's storages (not managed). On the encoder x8 at 98.5% of checkpoint-all's peak it took ~130-210 us a
step (2-3% of it) off the executor's own time, and the step's measured peak fell from 3.75 to 2.2 MB
(the first run's saved tensors no longer live beside the next layer's).

A process that runs schedules should call :func:`retain_freed_memory` once: glibc hands large freed
blocks back to the kernel, and a schedule that frees tensors mid-step would page-fault them back in on
every step, which a plain step does not.

Gradients (backward nodes' outputs) live in autograd's engine, which frees each after its last use as
the schedule does: a traced graph pins them (:attr:`poetlab.TrainingGraph.pinned`), so the simulator
refuses and no planner proposes a schedule that pages or recomputes one. What the executor still cannot
honour, it counts rather than hides: frees and page-outs of the batch, which belongs to the caller
(a "recompute" of it is a no-op), and paging or recomputing a pinned node in a schedule made some other
way (``n_skipped_ops``); a saved tensor the schedule did not hold when autograd asked for it is either an
error (``strict=True``) or fetched on demand (``n_unplanned``).

Why storages and not ``torch.utils.checkpoint``: checkpointing recomputes whole regions chosen before the
step, and its recompute happens when the backward first needs them. A POET schedule decides per tensor
and per moment (free here, page out there, recompute this node now, from inputs that may themselves
have been paged in), so the executor needs a handle on each tensor's memory that leaves autograd's graph
as it is: the storage.
"""

from __future__ import annotations

import math
import operator
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from concurrent.futures import Future

import torch
from torch import fx, nn

from poetlab.allocations import measure_allocations
from poetlab.costs import CostModel
from poetlab.errors import PoetlabError
from poetlab.graph import TrainingGraph
from poetlab.kernels import planned_kernels
from poetlab.paging import PageStore
from poetlab.schedule import Op, OpKind, Schedule, SimulationResult, simulate
from poetlab.techniques.bittrain import BitmapTensor, as_words, compress, decompress
from poetlab.trace import _fetch_attr, _tensors

__all__ = ["ExecutionError", "ExecutionResult", "ScheduleExecutor", "execute", "memory_allowance_bytes", "retain_freed_memory"]


class ExecutionError(PoetlabError, RuntimeError):
    """A schedule, graph or module that the executor cannot run together."""


@dataclass(frozen=True)
class ExecutionResult:
    """One executed step. Bytes and seconds; the prediction is the simulator's for the same schedule.

    ``total_peak_bytes`` is the allocator's peak above the memory in use when the step began, and
    ``peak_bytes`` the same without the parameters' gradients (found by address; POET keeps them outside
    the activation budget): activations, saved tensors, gradients of activations, workspace. Both are
    None when not measured. ``planned_peak_bytes`` is the schedule replayed by our own bookkeeping of
    the graph's bytes as the executor went (equal to the simulator's when every op was honoured).

    ``wall_s`` is the step's wall time; ``cpu_s`` its CPU time on the calling thread (autograd's CPU
    engine runs there too), which other processes' load does not inflate; both from the call's start to
    its end, set-up and clean-up included (what timing the call from outside would give); ``paging_wall_s`` and
    ``paging_cpu_s`` the wall and CPU time spent in page-outs and synchronous page-ins. Waiting for the
    disk is not CPU time, so :attr:`runtime_s` (CPU time outside paging + paging wall time) is the
    number to hold against the simulator's runtime, whose node times are CPU times (:mod:`poetlab.profile`).

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


# ---- how graph nodes map onto fx ---------------------------------------------------------------


@dataclass(frozen=True)
class _Binding:
    """Graph node index -> what to run: ``members`` (fx nodes, in order) for forward nodes, the forward
    node of each backward node, and which nodes are inputs or the loss."""

    members: tuple[tuple[fx.Node, ...], ...]
    forward_of: tuple[int | None, ...]
    backward_of_forward: dict[int, int]
    inputs: frozenset[int]
    loss: int
    output_arg: object  # the fx output node's argument (the model output, fx nodes inside)


def _bind(graph: TrainingGraph, gm: fx.GraphModule) -> _Binding:
    meta = graph.metadata
    if meta.get("source") != "poetlab.trace":
        raise ExecutionError(f"graph {graph.name!r} was not made by poetlab.trace; execute needs a traced graph (poetlab.trace(module, ...))")
    if meta.get("fx_code") is not None and meta["fx_code"] != gm.code:
        raise ExecutionError(f"graph {graph.name!r} was traced from a different module; trace this module again")
    by_name = {n.name: n for n in gm.graph.nodes}
    groups: dict[str, list[str]] = meta["fx_groups"]  # type: ignore[assignment]
    backward_of: dict[str, str] = meta["backward_of"]  # type: ignore[assignment]
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    members: list[tuple[fx.Node, ...]] = []
    forward_of: list[int | None] = []
    inputs = set()
    for i, node in enumerate(graph.nodes):
        if node.is_backward:
            forward_of.append(index[backward_of[node.name]])
            members.append(())
            continue
        forward_of.append(None)
        try:
            members.append(tuple(by_name[m] for m in groups[node.name]))
        except KeyError as exc:
            raise ExecutionError(f"graph {graph.name!r}: fx node {exc} of {node.name!r} is not in the module's trace; trace this module again") from None
        if node.kind == "input":
            inputs.add(i)
    params = dict(gm.named_parameters())
    for node in graph.nodes:
        names = meta.get("param_names", {}).get(node.name, [])  # type: ignore[union-attr]
        if names and sum(params[q].numel() * params[q].element_size() for q in names if q in params) != node.param_bytes:
            raise ExecutionError(f"graph {graph.name!r} was traced from a module with other parameter shapes ({node.name}); trace this module again")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return _Binding(
        members=tuple(members),
        forward_of=tuple(forward_of),
        backward_of_forward={f: j for j, f in enumerate(forward_of) if f is not None},
        inputs=frozenset(inputs),
        loss=index[str(meta.get("loss_node", "loss"))],
        output_arg=output.args[0],
    )


@dataclass(frozen=True)
class _CompiledGroup:
    """A forward node's fx nodes as one generated Python function (``torch.fx`` code generation):
    ``run(*values of deps)`` returns the values of the group's external fx nodes, the output last. It
    runs the very operations, in the same order, that interpreting the fx nodes one by one would, without
    the interpreter's per-node Python work (argument mapping, lookups), which dominated the executor's
    own overhead on models of many small operations. A rerun's code calls its BatchNorm modules through
    :class:`_RerunBatchNorm` (their fx targets: ``stand_ins``)."""

    deps: tuple[fx.Node, ...]
    run: Callable[..., tuple[object, ...]]
    stand_ins: frozenset[str] = frozenset()


#: the BatchNorm classes whose reruns :class:`_RerunBatchNorm` runs (exactly these: a subclass may do more)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _RerunBatchNorm:
    """A BatchNorm module as a rerun calls it: in training, the same ``F.batch_norm`` on the same batch
    statistics as its first run (the same bytes out and saved), but with running statistics of its own that
    nothing reads, so the module's running statistics and ``num_batches_tracked`` are updated once a step,
    by the first run, as in a plain step. In eval mode a BatchNorm writes nothing, and the module runs.

    Why: a rerun through the module updates them a second time, which the step then had to undo (before
    the backward pass: the reruns' buffers reset to the step's backup, their versions set back, one copy
    and two calls per buffer, :class:`_RerunBuffers`; or copied around each rerun). On MobileNetV2 x2 at
    half of checkpoint-all's peak that was ~50 us before the backward pass and a few microseconds per
    rerun, for 21 buffers. A module with hooks of its own when the executor is made is called as it is
    (its hooks run on the rerun too, and its buffers are put back as any module's); hooks registered later,
    and global module hooks, do not run on a stand-in's rerun."""

    __slots__ = ("module", "running_mean", "running_var")

    def __init__(self, module: nn.modules.batchnorm._BatchNorm):
        self.module = module
        self.running_mean = torch.zeros_like(module.running_mean)  # type: ignore[arg-type]
        self.running_var = torch.ones_like(module.running_var)  # type: ignore[arg-type]

    @staticmethod
    def applies(module: nn.Module) -> bool:
        """Whether a rerun may call ``module`` through a stand-in: one of :data:`_BATCH_NORMS` exactly that
        tracks running statistics, without hooks of its own (those stay the module's to run)."""
        return (
            type(module) in _BATCH_NORMS and module.track_running_stats  # type: ignore[operator]
            and module.running_mean is not None and module.running_var is not None
            and not (module._forward_hooks or module._forward_pre_hooks)
        )

    def run(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.module
        if not bn.training:
            return bn(x)
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, bn.weight, bn.bias, True, 0.0, bn.eps)


#: the fx node kinds that generated code can run as they are (placeholders read the caller's inputs)
_PLAIN_FX_OPS = ("call_module", "call_function", "call_method", "get_attr")


def _generated(gm: fx.GraphModule, graph: fx.Graph, own: dict[str, object] | None = None) -> fx.GraphModule:
    """``graph`` (whose modules and attributes are ``gm``'s, or ``own``'s where a target is one of its keys)
    as generated code that reaches each module and attribute it uses as one attribute of its own, under a
    flat name. Why: fx's code reaches a submodule by its path (``getattr(getattr(self.features, "1").conv,
    "0")``), one ``Module.__getattr__`` per part, which cost MobileNetV2 x2's forward pass ~0.25 ms (3%)
    against the model's own code. The modules and tensors are ``gm``'s own objects, not copies."""
    flat: dict[str, str] = {}
    root: dict[str, object] = {}
    for n in graph.nodes:
        if n.op in ("call_module", "get_attr"):
            target = str(n.target)
            if target not in flat:
                name = flat[target] = f"{target.replace('.', '_')}_{len(flat)}"
                root[name] = own[target] if own is not None and target in own else _fetch_attr(gm, target)
            n.target = flat[target]
    return fx.GraphModule(root, graph)


def _outside_inputs(members: Sequence[fx.Node]) -> dict[str, fx.Node]:
    """The fx nodes that ``members`` read and that are not among them, by name, in order of first read."""
    inside = {m.name for m in members}
    deps: dict[str, fx.Node] = {}
    for m in members:
        for d in m.all_input_nodes:
            if d.name not in inside:
                deps.setdefault(d.name, d)
    return deps


def _compile_group(gm: fx.GraphModule, members: tuple[fx.Node, ...], external: tuple[str, ...], rerun: bool = False) -> _CompiledGroup | None:
    """The group as a :class:`_CompiledGroup` (a rerun's: ``rerun``), or None for one that reads the caller's
    inputs (placeholders stay interpreted) or one without fx nodes (backward nodes). A group of one fx node
    too: interpreted, its arguments go through ``fx.node.map_arg`` and a lookup each (the encoder's layer,
    one module call: the encoder x8 at 98.5% took 28 and 46 us a step longer so, one executor beside the
    other in one process)."""
    if not members or any(m.op not in _PLAIN_FX_OPS for m in members):
        return None
    return _group_function(gm, members, external, rerun)


def _group_function(gm: fx.GraphModule, members: Sequence[fx.Node], external: Sequence[str], rerun: bool = False) -> _CompiledGroup:
    """``members`` as one generated function of the fx nodes they read from outside, returning the values
    of ``external`` (whatever the group's size: :func:`_compile_group` decides when it is worth it). A
    rerun's (``rerun``) calls each BatchNorm module that :meth:`_RerunBatchNorm.applies` to through a stand-in."""
    deps = _outside_inputs(members)
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {d: sub.placeholder(f"dep_{k}") for k, d in enumerate(deps.values())}
    stand_ins: dict[str, object] = {}  # (the stand-in's own fx target -> it)
    replaced: set[str] = set()  # (the BatchNorm modules' targets)
    for m in members:
        if rerun and _stands_in(gm, m):
            target = f"{m.target}.rerun"
            stand_ins.setdefault(target, _RerunBatchNorm(gm.get_submodule(str(m.target))))  # type: ignore[arg-type]
            replaced.add(str(m.target))
            env[m] = sub.call_method("run", (sub.get_attr(target), env[m.args[0]]))  # type: ignore[index]
        else:
            env[m] = sub.node_copy(m, lambda n: env[n])
    by_name = {m.name: env[m] for m in members}
    sub.output(tuple(by_name[name] for name in external))
    return _CompiledGroup(tuple(deps.values()), _generated(gm, sub, stand_ins).forward, frozenset(replaced))


def _stands_in(gm: fx.GraphModule, m: fx.Node) -> bool:
    """Whether a rerun's code calls fx node ``m`` through a :class:`_RerunBatchNorm` (a BatchNorm module it
    applies to, called on one value)."""
    return (
        m.op == "call_module" and _RerunBatchNorm.applies(gm.get_submodule(str(m.target)))
        and len(m.args) == 1 and isinstance(m.args[0], fx.Node) and not m.kwargs
    )


@dataclass(frozen=True)
class _Segment:
    """A run of the forward pass's schedule operations, ``start`` up to ``end`` (exclusive), carried out by
    one generated function: the first computes' fx nodes, in the schedule's order, and between them calls
    into the step for the operations that need its work. The executor's per-node work (one Python call
    per operation, per fx node and per dependency) then happens once for the whole run:

    - a compute of a node without saved-tensor hooks is its fx nodes, and nothing else (its bookkeeping
      is an event); a *packed* node's fx nodes run between ``run._begin`` and ``run._finish_in_segment``
      (once learnt, often the lean ``run._begin_owned`` and ``run._finish_owned``), which switch the hooks
      on and record what the node owns, as :meth:`_Run._first_compute` does;
    - frees of unmanaged nodes are events; frees of managed or kept nodes are ``run._free(node)``,
      page-outs and compressions ``run._do_at(position)``; the events since the last call are replayed
      (``run._replay``) before each call, so that the planned bytes are counted in the schedule's order;
    - unmanaged nodes whose storages a packed node of the segment may save or view are made known by key
      (``run._track``) as soon as they have run, unless that node finds its storages where the first step
      did (:meth:`ScheduleExecutor._learn`); the autograd nodes that get the pre-hooks driving the backward
      pass are collected as the nodes they hook have run (by the code itself once the first step has
      shown that their values are tensors, else ``run._hook_backward``), and hooked after the run;
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


_FREE, _COMPUTE, _SKIPPED_FREE, _RECOMPUTED_BATCH = 0, 1, 2, 3


@dataclass(frozen=True)
class _Tail:
    """The schedule's last run of bookkeeping, from position ``start`` to the end, as what it adds up to.
    It is the same on every step and nothing reads the nodes' states after it, so once a step has shown
    that it frees no storage, the steps after it that start it at the same position add these sums instead
    of replaying it event by event (checkpoint-all's whole backward pass: a few hundred events, about half
    a percent of MobileNetV2 x2's step). Where it starts depends on the pre-hooks, which change once after
    the first step (:meth:`ScheduleExecutor._learn`): a step that cannot use the sums keeps its own."""

    start: int
    n_computes: int
    n_recomputes: int
    n_skipped: int
    planned: int  # the change of the planned bytes
    rise: int  # the planned bytes' highest point above their value at ``start``


class _SummedReplay:
    """A run of bookkeeping events in the generated code of a step that has learnt (a plan, a segment:
    :func:`_advance_plan`, :func:`_compile_segment`), and, once it has been replayed without freeing a
    storage and without an unplanned fetch, what it adds up to (``sums``: the counts, the change of the
    planned bytes and their highest point above their start). It is the same on every such step, so the
    steps after add the sums and only set the states of the nodes that something reads later
    (``stateful``: not a gradient whose every operation is bookkeeping and whose autograd node drives
    nothing), as :class:`_Tail` does for the last run. MobileNetV2 x2 at half of checkpoint-all's peak
    replays 205 events a step in 25 runs, about half of them gradients': ~110 us of a step on the cold
    cache, event by event."""

    __slots__ = ("events", "stateful", "sums")

    def __init__(self, events: tuple[tuple[int, int], ...], stateless: frozenset[int]):
        self.events = events
        self.stateful = tuple((i, what == _COMPUTE or what == _RECOMPUTED_BATCH) for i, what in events if i not in stateless)
        self.sums: tuple[int, int, int, int, int] | None = None


def _bookkeeping(ex: "ScheduleExecutor", op: Op, position: int) -> tuple[int, int] | None:
    """``op`` (at ``position``) as an event ``(node, what)`` for :meth:`_Run._replay`, when it is one for
    which the step has nothing to do but count: a compute (of a node whose work is done elsewhere: a
    segment's, a gradient autograd computes; the caller decides), a "recompute" of the caller's batch
    (which never left), a free of an unmanaged node, a gradient or the batch (the last counted as
    skipped, as :meth:`_Run._do` does), or a free whose memory autograd gives back by itself (a node handed
    over: :func:`_handovers`). None when the operation needs real work."""
    i, inputs = op.node, ex.binding.inputs
    if op.kind is OpKind.COMPUTE:
        return (i, _RECOMPUTED_BATCH if i in inputs and ex._computed_at[i] != position else _COMPUTE)
    if op.kind is OpKind.FREE and i in inputs:
        return (i, _SKIPPED_FREE)
    if op.kind is OpKind.FREE and ((i not in ex._managed and i not in ex._kept) or position in ex._handed_frees):
        return (i, _FREE)
    return None


def _backward_runs(ex: "ScheduleExecutor") -> tuple[tuple[tuple[int, int] | None, ...], tuple[int, ...]]:
    """(events, ends): for each position of the schedule from the backward pass's first compute on, its
    operation as an event of :meth:`_Run._replay` when it is bookkeeping only (:func:`_bookkeeping`: a
    gradient autograd computes, once; a free of a gradient, of the batch, or of an unmanaged node the
    forward pass computed), and the end of the run of such operations that starts there (the position
    itself when it needs work). The backward pass, driven from autograd's pre-hooks, replays each run at
    once rather than operation by operation: checkpoint-all's whole backward pass is one run, done after
    ``loss.backward()``."""
    ops, binding, n_computes = ex.schedule.ops, ex.binding, ex._n_computes
    start = ex._backward_start
    forward_computed = {op.node for op in ops[:start] if op.kind is OpKind.COMPUTE}
    events: list[tuple[int, int] | None] = [None] * len(ops)
    for position in range(start, len(ops)):
        op = ops[position]
        if op.kind is OpKind.COMPUTE:
            bookkeeping = (binding.forward_of[op.node] is not None and n_computes[op.node] == 1) or op.node in binding.inputs
        else:  # (a free of an unmanaged node computed in the backward pass drops its values: _do)
            bookkeeping = op.kind is OpKind.FREE and (binding.forward_of[op.node] is not None or op.node in forward_computed)
        if bookkeeping:
            events[position] = _bookkeeping(ex, op, position)
    ends = list(range(len(ops) + 1))
    for position in range(len(ops) - 1, start - 1, -1):
        if events[position] is not None:
            ends[position] = ends[position + 1]
    return tuple(events), tuple(ends)


def _advance_plan(ex: "ScheduleExecutor", start: int, stop: int) -> Callable[["_Run"], None]:
    """What :meth:`_Run._advance` does from position ``start`` up to ``stop`` (exclusive), as one generated
    function of the run (as a :class:`_Segment`'s code is), for the steps after the first: each run of
    bookkeeping replayed at once (its events a constant, not a slice of them made per step), a rerun as
    its call (a compute of a forward node that an earlier position computed first: :meth:`_Run._rerun`),
    a free of a forward node as ``_free``, any other operation as ``_do_at``, each after the cursor is set
    to its position and followed by its hand-overs, and the cursor at ``stop`` in the end. Not which
    positions had work (``_Run.worked``): only the first step learns from it. (MobileNetV2 x2 at half of
    checkpoint-all's peak drives 7 pre-hooks a step: the loop around their work, its lookups and the
    dispatch of each operation took ~10-20 us of each on the cold cache of a backward pass.)"""
    ops, binding = ex.schedule.ops, ex.binding
    sub = fx.Graph()
    run = sub.placeholder("run")
    position = start
    while position < stop:
        end = min(ex._bookkeeping_end[position], stop)
        if end > position:
            sub.call_method("_replay_summed", (run, ex._summed_replay(ex._events[position:end])))
            position = end
            continue
        op = ops[position]
        i = op.node
        forward = binding.forward_of[i] is None and i not in binding.inputs
        sub.call_function(setattr, (run, "cursor", position))  # (where the step is, as _advance has it)
        if op.kind is OpKind.COMPUTE and forward and ex._computed_at[i] < position:
            sub.call_method("_rerun", (run, i))
        elif op.kind is OpKind.FREE and forward:
            sub.call_method("_free", (run, i))
        else:
            sub.call_method("_do_at", (run, position))
        for k in ex._handover.get(position, ()):
            sub.call_method("_hand_over", (run, k))
        position += 1
    sub.call_function(setattr, (run, "cursor", stop))
    sub.output(None)
    return fx.GraphModule(torch.nn.Module(), sub).forward


def _handovers(ex: "ScheduleExecutor") -> dict[int, tuple[int, int]]:
    """The nodes whose last free the step can leave to autograd, each with ``(use, free)``: the position
    after whose operation the step has no more use for the node, and that of the free.

    A managed or kept node whose last operation is a free in the backward pass, after the step's last use
    of it there (its own rerun or page-in, or the rerun of a node that reads it), is from then on held by
    autograd alone, in what it saved: autograd lets go of it as the last backward node that reads it has
    run, which the schedule's free follows. Once the step drops its own references right after that use
    (:meth:`_Run._hand_over`), the free is bookkeeping (:func:`_bookkeeping`), and a backward pre-hook
    that had only such frees to do is not needed any more (:meth:`ScheduleExecutor._learn`). Nodes that
    are compressed are left out (their copies are the step's to drop)."""
    ops, binding, nodes = ex.schedule.ops, ex.binding, ex.graph.nodes
    start = ex._backward_start
    last_use: dict[int, int] = {}
    last_op: dict[int, tuple[int, Op]] = {}
    compressed: set[int] = set()
    for position, op in enumerate(ops):
        i = op.node
        if binding.forward_of[i] is not None:
            continue
        if op.kind in _COMPRESSION_OPS:
            compressed.add(i)
        last_op[i] = (position, op)
        if op.kind is not OpKind.FREE:
            last_use[i] = position
        if op.kind is OpKind.COMPUTE:  # (a forward node's compute reads its inputs: the step's use of them)
            for k in nodes[i].inputs:
                last_use[k] = position
    found = {}
    for k in (ex._managed | ex._kept) - binding.inputs - compressed:
        free, op = last_op[k]
        use = last_use.get(k, -1)
        if op.kind is OpKind.FREE and start <= use < free:
            found[k] = (use, free)
    return found


#: what a segment does by calling into the step (:meth:`_Run._do`): none of it takes a node out of RAM
#: but a free, after which the segment's code reads the node no more
_SEGMENT_CALLS = frozenset({OpKind.FREE, OpKind.PAGE_OUT, OpKind.COMPRESS, OpKind.FREE_COMPRESSED})


def _segments(ex: "ScheduleExecutor") -> dict[int, _Segment]:
    """The forward pass's runs of two first computes or more (:class:`_Segment`), by their first position
    in the schedule. A run ends before an operation its code cannot do (a recompute, a page-in, the
    batch's first compute, the loss's while it is packed) and before a compute that reads a node the run
    has freed: that compute starts the next run, whose dependencies are looked up (and checked) by the step."""
    ops, binding, nodes = ex.schedule.ops, ex.binding, ex.graph.nodes

    def forward(i: int) -> bool:
        return binding.forward_of[i] is None and i not in binding.inputs and i != binding.loss

    def computable(position: int, op: Op) -> bool:  # (a first compute: recomputes are the step's)
        i = op.node
        if op.kind is not OpKind.COMPUTE or ex._computed_at.get(i) != position:
            return False
        if i == binding.loss:  # (run._compute_loss: not while its reads are checked)
            return i not in ex._packed_now and i not in ex._managed
        return forward(i) and all(m.op in _PLAIN_FX_OPS for m in binding.members[i])

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
        if (op.kind in (OpKind.FREE, OpKind.COMPUTE) and op.node in binding.inputs and ex._computed_at[op.node] < position) or (op.kind in _SEGMENT_CALLS and forward(op.node)):
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
            segments[start] = _compile_segment(ex, start, end)
    return segments


def _compile_segment(ex: "ScheduleExecutor", start: int, end: int) -> _Segment:
    """The :class:`_Segment` of operations ``start:end``."""
    binding, nodes, packed = ex.binding, ex.graph.nodes, ex._packed_now
    ops = ex.schedule.ops[start:end]
    computed = [op.node for op in ops if op.kind is OpKind.COMPUTE and op.node not in binding.inputs]
    in_segment = set(computed)
    freed = {op.node for op in ops if op.kind is OpKind.FREE}
    members = [m for i in computed for m in binding.members[i]]
    inside = {m.name for m in members}
    deps = _outside_inputs(members)
    if binding.loss in in_segment:  # (the loss reads the model's outputs: fx nodes, no members of its own)
        read: list[fx.Node] = []
        fx.node.map_arg(binding.output_arg, read.append)
        for d in read:
            if d.name not in inside:
                deps.setdefault(d.name, d)
    # unmanaged nodes of the segment a packed one reads: known by key at once (their frees are calls, to
    # forget them); not for a packed node that finds its storages where the first step did (_learn)
    tracked = {k for i in computed if i in packed and i not in ex._owned_sources for k in nodes[i].inputs} & in_segment - packed
    keep = {i for i in computed if i in ex._managed or (i not in freed and i in ex._kept)}
    outputs = [
        m.name for i in computed for m in binding.members[i]
        if m.name in ex._external[i] and (i in keep or (i not in freed and any(u.name not in inside for u in m.users)))
    ]
    # the parameters and buffers it reads as attributes, in its own code (not looked up by the step)
    attributes = [d for d in deps.values() if d.op == "get_attr" and d.name not in ex._group_of]
    looked_up = [d for d in deps.values() if d not in attributes]
    sub = fx.Graph()
    env_list, run = sub.placeholder("env"), sub.placeholder("run")
    env: dict[fx.Node, fx.Node] = {d: sub.node_copy(d) for d in attributes}
    env.update({d: sub.call_method("pop", (env_list,)) for d in reversed(looked_up)})
    events: list[tuple[int, int]] = []
    pending_hooks: fx.Node | None = None

    def flush() -> None:  # (the bookkeeping before the next call, in the schedule's order)
        if events:
            if ex._learnt:
                sub.call_method("_replay_summed", (run, ex._summed_replay(events)))
            else:
                sub.call_method("_replay", (run, tuple(events)))
            events.clear()

    def call(method: str, *args: object) -> None:
        flush()
        sub.call_method(method, (run, *args))

    for position, op in enumerate(ops, start):
        i = op.node
        if op.kind is not OpKind.COMPUTE or i in binding.inputs:  # (the batch is only "recomputed" here)
            # (a graphless node's free is a call: it lets go of its first run's values, _Run._free)
            bookkeeping = op.kind is OpKind.COMPUTE or (op.kind is OpKind.FREE and (i not in in_segment or i not in packed | tracked | ex._graphless))
            event = _bookkeeping(ex, op, position) if bookkeeping else None
            if event is None and op.kind is OpKind.FREE and i not in binding.inputs:
                call("_free", i)  # (what _do does for it)
            elif event is None:
                call("_do_at", position)
            else:
                events.append(event)
            continue
        # (a packed node that finds its storages where the first step did, nothing tracked: the lean pair;
        # without the saved-tensor hooks where its fx values and their autograd nodes show them all)
        owned = i in ex._owned_places and not ex._tracking
        places = ex._hookless[i][0] if owned and i in ex._hookless else None
        if i == binding.loss:
            call("_compute_loss", i, fx.node.map_arg(binding.output_arg, lambda n: env[n]))
            continue
        if places is not None:
            flush()
        elif i in packed:
            call("_begin_owned", i) if owned else call("_begin", i, True)
        if i in ex._graphless:  # (its values are those of one call: _Run._graphless_in_segment)
            compiled = ex._compiled[i]
            assert compiled is not None
            results = sub.call_method("_graphless_in_segment", (run, i, *[env[d] for d in compiled.deps]))
            by_name = {m.name: m for m in binding.members[i]}
            for k, name in enumerate(ex._external[i]):
                env[by_name[name]] = sub.call_function(operator.getitem, (results, k))
        else:
            for m in binding.members[i]:
                env[m] = sub.node_copy(m, lambda n: env[n])
        external = [env[m] for m in binding.members[i] if m.name in ex._external[i]]
        if places is not None:
            by_name = {m.name: env[m] for m in binding.members[i]}
            fns = {name: sub.call_function(getattr, (by_name[name], "grad_fn")) for name in dict.fromkeys(name for name, attr in places if attr)}
            found = tuple(by_name[name] if attr is None else sub.call_function(getattr, (fns[name], attr)) for name, attr in places)
            sub.call_method("_finish_hookless", (run, i, found))
        elif i in packed:
            if owned:
                sub.call_method("_finish_owned", (run, i, external))
            else:  # (the first step also shows its fx values, to find its storages without hooks: _finish)
                members_now = tuple(env[m] for m in binding.members[i]) if not ex._learnt and i in ex._managed else None
                sub.call_method("_finish_in_segment", (run, i, external, members_now))
                continue
        else:
            events.append((i, _COMPUTE))
            if i in tracked:
                sub.call_method("_track", (run, i, external))
        j = binding.backward_of_forward.get(i)
        if j in ex._hook_at and ex._tensor_valued.get(i):
            # its outputs' autograd nodes collected here, hooked after the segment (_Run._hook_pending)
            if pending_hooks is None:
                pending_hooks = sub.call_function(getattr, (run, "pending_hooks"))
            fns = tuple(sub.call_function(getattr, (v, "grad_fn")) for v in external)
            sub.call_method("append", (pending_hooks, (j, fns)))
        elif j in ex._hook_at:
            sub.call_method("_hook_backward", (run, i, external, owned))  # (a lean node's deferred: _finish_owned)
    sub.output(tuple(env[m] for m in members if m.name in outputs))
    module = _generated(ex.gm, sub)
    return _Segment(
        start=start,
        end=end,
        deps=tuple(looked_up),
        freed_before=tuple(sorted(freed - in_segment - ex._managed - binding.inputs)),
        outputs=tuple(outputs),
        escaping=tuple(
            (i, names) for i in computed
            if ex._tracking and i not in packed and i not in tracked and (names := tuple(m.name for m in binding.members[i] if m.name in outputs))
        ),
        events=tuple(events),
        run=module.forward,
    )


def _managed_nodes(graph: TrainingGraph, schedule: Schedule, binding: _Binding) -> tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int]]:
    """(managed, packed, hooked, kept): which nodes need the executor's machinery, found once from the schedule.

    A forward node is *managed* when the schedule does more with it than plain autograd would: it frees
    it while a later operation still reads it (to recompute it or page it back in, or by mistake, which
    strict mode reports), pages or compresses it, or recomputes it. Every other forward node is computed
    once and freed after its last use, which is what PyTorch does by itself: autograd keeps what it saved
    until the backward node that reads it has run, reference counting frees the rest. Such nodes run
    without bookkeeping of their storages, without saved-tensor hooks, and their values are dropped at
    their free (or when the backward pass begins). Those a recompute reads (*kept*) keep their values
    until their free instead: the reference keeps the memory, as the schedule does, and the machinery's
    cost per managed node (~90 us of Python per node on MobileNetV2: saved-tensor hooks on its ~8 saved
    tensors, records, pre-hooks) is not paid for them. *packed* nodes run under the saved-tensor hooks:
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
    readers: dict[int, list[int]] = {}
    for j, node in enumerate(nodes):
        for i in node.inputs:
            readers.setdefault(i, []).append(j)
    computes: dict[int, list[int]] = {}  # node -> positions of its computes
    for position, op in enumerate(schedule.ops):
        if op.kind is OpKind.COMPUTE:
            computes.setdefault(op.node, []).append(position)
    last_read = {i: max((p for j in readers.get(i, ()) for p in computes.get(j, ())), default=-1) for i in range(len(nodes))}
    managed: set[int] = set()
    for position, op in enumerate(schedule.ops):
        i = op.node
        if not forward[i]:
            continue
        if op.kind is OpKind.FREE:
            if position < last_read[i]:
                managed.add(i)
        elif op.kind is not OpKind.COMPUTE or len(computes[i]) > 1:
            managed.add(i)
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


def _graphless_nodes(ex: "ScheduleExecutor") -> frozenset[int]:
    """The managed forward nodes whose first run builds no autograd graph (:class:`_GraphlessRun`): those
    the schedule only recomputes, once, in the backward pass, and that nothing but their own backward node
    reads there.

    Such a node's first run is thrown away whole: the schedule frees all of it (output and saved tensors)
    before any backward node reads it and reruns it before its backward node, the only reader left. Run
    with autograd's graph, its first run saves its tensors (a Python call each, under the saved-tensor
    hooks), has its storages recorded, emptied at the free and refilled from the rerun; the encoder's
    transformer layer saves 29, which made most of the executor's own time on the encoder x8 at 98.5%
    (``benchmarks/EXECUTOR_CHANGES.md``). Run with grad off inside one autograd function, it saves nothing,
    and the rerun's own graph is what autograd runs backward.

    A node qualifies when: it has generated code (:func:`_compile_group`) and a backward node; the
    schedule computes it once in the forward pass and once more in the backward pass, and otherwise only
    frees it (no paging, no compression); among the backward nodes only its own reads it; no other node's
    rerun reads it (a rerun reads the first run's values); and none of its parameters or buffers is any
    other node's (its rerun's engine run accumulates its parameters' gradients by itself: a parameter read
    elsewhere too could add up in another order than a plain step's)."""
    schedule, binding, nodes = ex.schedule, ex.binding, ex.graph.nodes
    start = ex._backward_start
    positions: dict[int, list[tuple[int, OpKind]]] = {}
    for position, op in enumerate(schedule.ops):
        positions.setdefault(op.node, []).append((position, op.kind))
    backward_readers: dict[int, set[int]] = {}
    for j, node in enumerate(nodes):
        if binding.forward_of[j] is not None:
            for i in node.inputs:
                backward_readers.setdefault(i, set()).add(j)
    rerun_inputs = {k for j, n in ex._n_computes.items() if n > 1 for k in nodes[j].inputs}

    def constants(i: int) -> set[int]:
        found: list[torch.Tensor] = []
        members = binding.members[i]
        for m in [*members, *(d for d in _outside_inputs(members).values() if d.op == "get_attr")]:
            if m.op == "call_module":
                module = ex.modules[m.target]
                found += [*module.parameters(), *module.buffers()]
            elif m.op == "get_attr":
                value = _fetch_attr(ex.gm, str(m.target))
                if isinstance(value, torch.Tensor):
                    found.append(value)
        return {id(t) for t in found}

    candidates = []
    for i in ex._managed:
        j = binding.backward_of_forward.get(i)
        ops = positions.get(i, [])
        computes = [p for p, kind in ops if kind is OpKind.COMPUTE]
        if (
            j is None or ex._compiled[i] is None or i == binding.loss or i in rerun_inputs
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


class _GraphlessRun(torch.autograd.Function):
    """A graphless node's first run (:func:`_graphless_nodes`): its generated code with grad off (an
    autograd function's forward runs so), its values this function's outputs. Its backward runs autograd's
    engine on the graph the node's rerun built (:meth:`_Run._recompute` leaves it, with its detached inputs,
    in the node's state): the rerun's parameters get their gradients there, as in a plain step, and the
    gradients of its inputs are this function's. ``trigger`` is a 0-d tensor that requires grad, so that
    autograd records the function even where no input requires grad (a node reading only the batch)."""

    @staticmethod
    def forward(ctx, state: "_NodeState", run: Callable[..., tuple[object, ...]], trigger: torch.Tensor, *deps: object) -> tuple[object, ...]:  # type: ignore[override]
        ctx.state = state
        results = run(*deps)
        inputs = {_key(d.untyped_storage()) for d in deps if isinstance(d, torch.Tensor)}
        # (an output that is an input or a view of one would be marked a view by autograd: a copy instead)
        results = tuple(r.clone() if isinstance(r, torch.Tensor) and _key(r.untyped_storage()) in inputs else r for r in results)
        fixed = [r for r in results if isinstance(r, torch.Tensor) and not (r.is_floating_point() or r.is_complex())]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return results

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[object, ...]:  # type: ignore[override]
        state: _NodeState = ctx.state
        rerun, state.rerun = state.rerun, None
        if rerun is None:
            raise ExecutionError("autograd reached a node run without its graph before the schedule recomputed it; plan on the traced graph")
        results, inputs, detached = rerun
        pairs = [(r, g) for r, g in zip(results, grads, strict=True) if isinstance(r, torch.Tensor) and r.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
        return (None, None, None, *(d.grad if own and isinstance(d, torch.Tensor) else None for d, own in zip(inputs, detached, strict=True)))


def _detached(value: object) -> object:
    """Detached aliases of the tensors in ``value``, requiring grad where the originals did, so that a
    rerun saves the same tensors for backward as the first run did."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


_MISSING = object()
# autograd's saved-tensor hooks switched on and off without the context manager's three Python calls
# (what ``torch.autograd.graph.saved_tensors_hooks`` does inside), for the learnt steps' lean paths, once
# per managed node and per rerun: with grad mode set the same way, ~0.45 us against ~1.6 warm, several
# times both on the cold cache a forward pass leaves (private calls of the pinned torch, checked for by
# ScheduleExecutor)
_push_saved_hooks = getattr(torch._C._autograd, "_push_saved_tensors_default_hooks", None)
_pop_saved_hooks = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
_PUSHED = object()  # (_Run.hooks while hooks pushed that way are on)
# sets tensors' version counters: a buffer that a node without the saved-tensor hooks saved, and that the
# step writes back to the very bytes it was saved with, gets its version back (ScheduleExecutor._without_hooks)
_set_versions = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
_COMPRESSION_OPS = frozenset({OpKind.COMPRESS, OpKind.DECOMPRESS, OpKind.FREE_COMPRESSED})


def _key(storage: torch.UntypedStorage) -> int:
    """Identity of a storage that survives resizing (the StorageImpl's address)."""
    return storage._cdata


def _storages(values: Iterable[object]) -> list[torch.UntypedStorage]:
    """The storage of each tensor in ``values``, in order."""
    return [t.untyped_storage() for value in values for t in _tensors(value)]


@dataclass(eq=False, slots=True)
class _Storage:
    """A storage owned by forward node ``owner``, and where a rerun of the node finds its fresh copy:
    ``("value", fx name, tensor index)`` or ``("pack", position of the saved tensor)``. ``refs`` counts
    the nodes in RAM whose values live in it (a view node shares its producer's storage, an ``Identity``
    returns its input): it is freed only when the last of them is."""

    storage: torch.UntypedStorage
    nbytes: int
    owner: int
    source: tuple
    refs: int = 0
    pending: Future | None = None
    packed: BitmapTensor | None = None

    @property
    def materialized(self) -> bool:
        return self.storage.nbytes() == self.nbytes


@dataclass(slots=True)
class _NodeState:
    # (tuples, replaced when a node comes to own or hold storages: most never do, and a step makes one
    # state per node of the graph)
    owned: tuple[_Storage, ...] = ()
    held: tuple[_Storage, ...] = ()
    computed: bool = False
    in_ram: bool = False
    on_flash: bool = False
    paged: tuple[_Storage, ...] = ()  # (the storages of its last page-out, in the order of its file)
    rng_state: torch.Tensor | None = None
    n_packs: int = 0
    unmanaged_keys: tuple[int, ...] = ()  # storage keys of an unmanaged node's values, while they live
    # a graphless node's rerun, between it and its backward: (its values, its inputs, which were detached)
    rerun: tuple[tuple[object, ...], list[object], list[bool]] | None = None
    # a graphless node's first run's values, from it to its free (_Run._graphless_in_segment)
    first_values: tuple[object, ...] | None = None


class _BufferBackup:
    """A copy of a module's buffers (BatchNorm's running statistics, which the forward pass updates), taken
    at the start of every step: put back after a failure, and what the reruns' buffers are reset from
    (:class:`_RerunBuffers`). ``copies[k]`` is ``buffers[k]``'s copy.

    Taken with one ``torch.cat`` per dtype of the 1-d buffers and one ``torch.stack`` per dtype of the 0-d
    ones (BatchNorm's ``num_batches_tracked``) into tensors allocated once, whose slices are the copies;
    only buffers of other shapes are copied one by one. ``torch._foreach_copy_`` on a CPU copies tensor by
    tensor, each through its own TensorIterator: for MobileNetV2's 156 buffers that was ~170 us of every
    step (``perf record`` of 150 executed steps of MobileNetV2 x2 at 50%, against a hand step's)."""

    __slots__ = ("_joined", "_each", "copies")

    def __init__(self, buffers: Sequence[torch.Tensor]):
        groups: dict[tuple[torch.dtype, int], list[int]] = {}
        for k, b in enumerate(buffers):
            groups.setdefault((b.dtype, b.dim() if b.dim() < 2 else -1), []).append(k)
        copies: list[torch.Tensor | None] = [None] * len(buffers)
        # (join, the buffers, the tensor they are joined into)
        self._joined: list[tuple[Callable[..., torch.Tensor], list[torch.Tensor], torch.Tensor]] = []
        self._each: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        for (dtype, dim), members in groups.items():
            tensors = [buffers[k] for k in members]
            if dim == 1:
                joined = torch.empty(sum(t.numel() for t in tensors), dtype=dtype)
                parts = joined.split([t.numel() for t in tensors])
                self._joined.append((torch.cat, tensors, joined))
            elif dim == 0:
                joined = torch.empty(len(tensors), dtype=dtype)
                parts = joined.unbind()
                self._joined.append((torch.stack, tensors, joined))
            else:
                parts = [torch.empty_like(t) for t in tensors]
                self._each[0].extend(parts)
                self._each[1].extend(tensors)
            for k, part in zip(members, parts, strict=True):
                copies[k] = part
        self.copies: list[torch.Tensor] = copies  # type: ignore[assignment]

    def take(self) -> bool:
        """Copy the buffers; False if the copies no longer fit them (a buffer given another size since,
        ``.data = ...``: the join resized its tensor, the copies are not its slices): make a new backup."""
        for join, tensors, joined in self._joined:
            size = joined.numel()
            join(tensors, out=joined)
            if joined.numel() != size:
                return False
        if self._each[0]:
            torch._foreach_copy_(*self._each)
        return True


@dataclass(frozen=True)
class _RerunBuffers:
    """The buffers of the forward nodes rerun in the backward pass that each rerun updates a second time
    (those of the modules a rerun calls as they are: not BatchNorm's, :class:`_RerunBatchNorm`; a
    SyncBatchNorm's running statistics, a module's own buffers), and how a step gives them back the values
    its forward pass left.

    - Reset (``before_step``: their copies in the step's backup, ``ScheduleExecutor.step``): when each
      buffer is one node's alone and that node reruns once in the backward pass, the buffers are set back
      to the values the step began with just before the backward pass, and the reruns update them as
      their first runs did, to the same bits (the same batch statistics: a rerun gives the same bytes).
      One copy a step, and each rerun sees the buffers its first run saw. Only in steps that read
      unchecked (``ScheduleExecutor._learn``: nothing is fetched unplanned, so nothing reruns twice).
    - Kept (``kept``): otherwise (a module several nodes share, a node rerun twice, the first step) they
      are copied before the backward pass and put back after it, rather than around every rerun (two
      copies of a few small tensors cost a rerun ~30 us on a cold cache); a rerun runs on buffers that
      its first run has updated already (BatchNorm in training normalizes with the batch's statistics and
      only updates its running ones).

    MobileNetV2 x2 at half of checkpoint-all's peak reruns 7 nodes with 21 buffers (when its BatchNorm
    layers were called as they are): keeping them took ~33 us of a step on the cold cache and putting them
    back ~58; the reset is one such copy."""

    buffers: list[torch.Tensor]
    kept: list[torch.Tensor]
    before_step: list[torch.Tensor] | None


class _Saved:
    """What autograd holds for a saved tensor: a detached alias and the record of its storage."""

    __slots__ = ("tensor", "record")

    def __init__(self, tensor: torch.Tensor, record: object):
        self.tensor = tensor
        self.record = record


# ---- the executor ------------------------------------------------------------------------------


class ScheduleExecutor:
    """Runs ``schedule`` on ``module`` step after step (the fx trace and the binding are built once).

    ``loss_fn(output, targets)`` must be the loss the graph was traced with; ``paging_dir`` is where the
    private paging directory is made (the system's temporary directory by default).
    """

    # (slots, for the steps' reads of its attributes: see _Run's)
    __slots__ = (
        "module", "graph", "schedule", "loss_fn", "paging_dir", "prefetch", "durable", "strict", "gm",
        "binding", "modules", "params", "constants", "_constants_met", "buffers", "draws_rng", "_tensor_valued",
        "placeholders", "_batch_of", "_group_of", "_external", "_compiled", "_n_computes", "_managed",
        "_packed", "_hooked", "_kept", "_learnt", "_unchecked_reads", "_owned_sources", "_owned_places",
        "_tracking", "_computed_at", "_handover", "_handed_frees", "_segments", "_backward_start",
        "_handover_candidates", "_bookkeeping_end", "_last_run", "_tail", "_plans", "_output_bytes",
        "_has_pageouts", "_rerun_code", "_buffer_backup", "_buffers_of", "_rerun_in_backward", "_backward_buffers", "_aside",
        "_packed_now", "_events", "_hook_at", "_summed", "_stateless", "_hookless", "_graphless", "_trigger",
    )

    def __init__(
        self,
        module: nn.Module,
        graph: TrainingGraph,
        schedule: Schedule,
        loss_fn: Callable[..., torch.Tensor],
        *,
        paging_dir: str | None = None,
        prefetch: bool = False,
        durable: bool = True,
        strict: bool = True,
    ):
        if schedule.n_nodes != graph.n_nodes:
            raise ExecutionError(f"schedule has {schedule.n_nodes} nodes but graph {graph.name!r} has {graph.n_nodes}; plan on this graph")
        self.module = module
        self.graph = graph
        self.schedule = schedule
        self.loss_fn = loss_fn
        self.paging_dir = paging_dir
        self.prefetch = prefetch
        self.durable = durable
        self.strict = strict
        self.gm = fx.symbolic_trace(module)
        self.binding = _bind(graph, self.gm)
        self.modules = dict(self.gm.named_modules())
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.constants = [*module.parameters(), *module.buffers()]  # (their storages are looked up per step)
        # the constants whose storages the first step's managed and packed nodes met (see _learn); until
        # then, all of them are looked up
        self._constants_met: list[torch.Tensor] | None = None
        self.buffers = [b for b in module.buffers() if b.numel()]
        # whether each forward node draws random numbers (dropout), learnt on the first step: a node that
        # does has the RNG state before it kept, to replay on a recompute
        self.draws_rng: dict[int, bool] = {}
        # whether each hooked forward node's values (its external fx nodes') are tensors, learnt on the first
        # step: the segments' code then collects their autograd nodes itself (_compile_segment)
        self._tensor_valued: dict[int, bool] = {}
        self.placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        # each input node's fx names and the positions of the caller's inputs they take (a traced graph's
        # input nodes are one placeholder each: poetlab.trace)
        self._batch_of: dict[int, tuple[tuple[str, int], ...]] = {}
        for i in self.binding.inputs:
            members = self.binding.members[i]
            if any(m.op != "placeholder" for m in members):
                raise ExecutionError(f"input node {graph.nodes[i].name} of graph {graph.name!r} computes more than a placeholder; trace the module again")
            self._batch_of[i] = tuple((m.name, self.placeholders.index(m)) for m in members)
        self._group_of: dict[str, int] = {m.name: i for i, ms in enumerate(self.binding.members) for m in ms}
        # fx names whose values are read outside their group (kept for the whole step)
        self._external: list[tuple[str, ...]] = []
        for i, ms in enumerate(self.binding.members):
            names = {m.name for m in ms}
            ext = [m.name for m in ms if any(u.name not in names for u in m.users)]
            if ms and ms[-1].name not in ext:
                ext.append(ms[-1].name)
            self._external.append(tuple(ext))
        self._compiled = [
            _compile_group(self.gm, ms, ext) if i != self.binding.loss else None
            for i, (ms, ext) in enumerate(zip(self.binding.members, self._external, strict=True))
        ]
        self._n_computes: dict[int, int] = {}
        for op in schedule.ops:
            if op.kind is OpKind.COMPUTE:
                self._n_computes[op.node] = self._n_computes.get(op.node, 0) + 1
        # the reruns' code: their BatchNorm modules through _RerunBatchNorm (the first runs' where it has none)
        self._rerun_code: list[_CompiledGroup | None] = list(self._compiled)
        for i, n in self._n_computes.items():
            members = self.binding.members[i]
            if n > 1 and self._compiled[i] is not None and any(_stands_in(self.gm, m) for m in members):
                self._rerun_code[i] = _compile_group(self.gm, members, self._external[i], rerun=True)
        self._managed, self._packed, self._hooked, self._kept = _managed_nodes(graph, schedule, self.binding)
        # the position of the first backward compute (the schedule's end if there is none)
        self._backward_start = next(
            (p for p, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and self.binding.forward_of[op.node] is not None), len(schedule.ops))
        # the managed nodes whose first run builds no autograd graph (_graphless_nodes): from then on they are
        # no storages of the step's (not managed, nothing packed for them); their reruns and backward pre-hooks
        # stay (_hooked, _kept)
        self._graphless = _graphless_nodes(self)
        if self._graphless:
            self._managed = self._managed - self._graphless
            self._packed = self._managed | {j for j, node in enumerate(graph.nodes) if j in self._packed and any(k in self._managed for k in node.inputs)}
        self._trigger = torch.zeros((), requires_grad=True)  # (_GraphlessRun's)
        # the backward nodes whose autograd nodes get a pre-hook and the forward nodes that run under the
        # saved-tensor hooks: all of _hooked and _packed until a step has shown which need them (_learn)
        self._hook_at, self._packed_now, self._learnt = self._hooked, self._packed, False
        # whether autograd's reads of saved tensors go unchecked, and which of its values and saved tensors
        # each managed node owns (learnt: _learn)
        self._unchecked_reads = False
        self._owned_sources: dict[int, tuple[tuple, ...]] = {}
        # the same, as (from its saved tensors?, index there or among its external values, tensor index)
        self._owned_places: dict[int, tuple[tuple[bool, int, int], ...]] = {}
        # of those, the nodes whose storages are all among their fx values and the tensors those values'
        # autograd nodes saved: (fx name, None or the autograd node's ``_saved_*`` attribute) for each, in
        # ``_owned_sources``' order, and how many tensors its first run saved (what a rerun must save too);
        # they run without the saved-tensor hooks (_Run._finish_hookless)
        self._hookless: dict[int, tuple[tuple[tuple[str, str | None], ...], int]] = {}
        # whether unmanaged nodes' storages are made known by key (_Run._track_values): until a step has
        # shown that every packed node finds its storages by position, which then look none up (_learn)
        self._tracking = True
        if any(n > 1 for n in self._n_computes.values()) and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
            # (a private API of the pinned torch: it moves a rerun's fresh bytes into the emptied storage)
            raise ExecutionError(f"torch {torch.__version__} cannot move recomputed bytes in place (no UntypedStorage._swap_data_ptr_); install the pinned torch (pyproject.toml)")
        if _push_saved_hooks is None or _pop_saved_hooks is None or not hasattr(torch._C, "_set_grad_enabled"):
            raise ExecutionError(f"torch {torch.__version__} lacks the saved-tensor hook calls the executor uses; install the pinned torch (pyproject.toml)")
        # where each node is first computed
        self._computed_at = {op.node: p for p, op in reversed(list(enumerate(schedule.ops))) if op.kind is OpKind.COMPUTE}
        # the nodes handed over to autograd after the step's last use of them, by that use's position, and
        # the positions of their last frees (_handovers): none until a step has shown which (_learn)
        self._handover: dict[int, tuple[int, ...]] = {}
        self._handed_frees: frozenset[int] = frozenset()
        self._segments = _segments(self)
        self._handover_candidates = _handovers(self)  # (those of them nobody else holds are handed over: _learn)
        self._events, self._bookkeeping_end = _backward_runs(self)
        self._last_run = self._bookkeeping_end.index(len(schedule.ops))  # (where the last run starts)
        self._tail: _Tail | None = None  # (learnt: _Run._advance_to_end, step)
        self._plans: dict[tuple[int, int], Callable[[_Run], None]] = {}  # (cursor, backward node) -> _advance_plan
        self._output_bytes = [node.output_bytes for node in graph.nodes]
        self._has_pageouts = any(op.kind is OpKind.PAGE_OUT for op in schedule.ops)
        self._buffer_backup: _BufferBackup | None = None
        self._buffers_of: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        # the forward nodes the schedule reruns in the backward pass (after the first gradient's compute)
        self._rerun_in_backward = frozenset(
            op.node for op in schedule.ops[self._backward_start:]
            if op.kind is OpKind.COMPUTE and self.binding.forward_of[op.node] is None and op.node not in self.binding.inputs
        )
        self._backward_buffers: _RerunBuffers | None = None
        # the generated code's runs of bookkeeping once learnt (_SummedReplay, by index), and the gradients
        # whose states nothing reads: every operation of theirs is bookkeeping (set by _learn, with _hook_at)
        self._summed: list[_SummedReplay] = []
        self._stateless: frozenset[int] = frozenset()

    def _without_hooks(self, run: "_Run") -> dict[int, tuple[tuple[tuple[str, str | None], ...], int]]:
        """The lean managed nodes that the first step found all of whose storages without the saved-tensor
        hooks (``run.hookless``: :meth:`_Run._hookless_places`), for :attr:`_hookless`.

        Without the hooks, autograd checks each saved tensor's version counter when it reads it back: a
        rerun buffer (:class:`_RerunBuffers`: a SyncBatchNorm's running statistics), which the step writes
        a second time (its reset before the backward pass and the rerun's update, or a forward rerun's
        update and put-back), would fail that check. Each such write leaves the very bytes the buffer was
        saved with by the time the node's backward reads it (:class:`_RerunBuffers`' reset), so the step
        sets those buffers' versions back after it (``_set_versions``, a private call of the pinned torch).
        Where buffers are kept and put back after the backward pass instead (a module shared by several
        nodes, a node rerun twice), they do not hold those bytes in
        between: a node that saved one of them keeps the hooks (which autograd does not version-check)."""
        found = {i: places for i, places in run.hookless.items() if places is not None and i in self._owned_sources}
        if not found or _set_versions is None:
            return {}
        rerun = self._rerun_buffers()
        if rerun.buffers and rerun.before_step is None:
            rewritten = {id(b) for b in rerun.buffers}
            found = {i: places for i, places in found.items() if not any(id(b) in rewritten for b in self._node_buffers(i))}
        return found

    def _summed_replay(self, events: Sequence[tuple[int, int]]) -> int:
        """A new :class:`_SummedReplay` of ``events``, by its index in ``_summed`` (what generated code passes)."""
        self._summed.append(_SummedReplay(tuple(events), self._stateless))
        return len(self._summed) - 1

    def _group_buffers(self, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Forward node ``i``'s rerun's buffers (:meth:`_node_buffers`, which a rerun would update a second
        time) and as many tensors to keep them in while it reruns, allocated once."""
        found = self._buffers_of.get(i)
        if found is None:
            buffers = self._node_buffers(i)
            found = self._buffers_of[i] = (buffers, [torch.empty_like(b) for b in buffers])
        return found

    def _node_buffers(self, i: int) -> list[torch.Tensor]:
        """The buffers of the modules forward node ``i``'s rerun calls (its BatchNorm modules' stand-ins
        write none of theirs: :class:`_RerunBatchNorm`)."""
        code = self._rerun_code[i]
        stand_ins = code.stand_ins if code is not None else frozenset()
        modules = [self.modules[m.target] for m in self.binding.members[i] if m.op == "call_module" and m.target not in stand_ins]
        return [b for mod in modules for b in mod.buffers() if b.numel()]

    def _rerun_buffers(self) -> _RerunBuffers:
        """The buffers of the nodes rerun in the backward pass (each once, in case modules are shared), and
        how a step gives them back the values its forward pass left (:class:`_RerunBuffers`), found once."""
        if self._backward_buffers is None:
            found = {id(b): b for i in sorted(self._rerun_in_backward) for b in self._node_buffers(i)}
            buffers = list(found.values())
            # reset to the step's backup, if every one is its node's alone and the node reruns once there
            owners: dict[int, int] = {}
            for k, members in enumerate(self.binding.members):
                if members and self.binding.forward_of[k] is None:
                    for b in self._node_buffers(k):
                        owners[id(b)] = owners.get(id(b), 0) + 1
            reruns = [op.node for op in self.schedule.ops[self._backward_start:] if op.kind is OpKind.COMPUTE]
            backup = {id(b): self._buffer_backup.copies[k] for k, b in enumerate(self.buffers)} if self._buffer_backup else {}
            alone = all(owners.get(key) == 1 and key in backup for key in found) and all(reruns.count(i) == 1 for i in self._rerun_in_backward)
            self._backward_buffers = _RerunBuffers(
                buffers=buffers,
                kept=[torch.empty_like(b) for b in buffers],  # (the first step keeps them: it reads checked)
                before_step=[backup[key] for key in found] if alone else None,
            )
        return self._backward_buffers

    def _set_aside_grads(self) -> None:
        """Take the caller's gradients off the parameters (kept in ``_aside``: :meth:`_restore_grads`).
        Mostly there are none (``zero_grad(set_to_none=True)``): then nothing is kept, without a Python
        loop over the parameters (MobileNetV2 has 158)."""
        aside = [p.grad for p in self.params]
        if aside.count(None) == len(aside):
            self._aside = ()  # (taken: none)
            return
        self._aside = aside
        for p, old in zip(self.params, aside, strict=True):
            if old is not None:
                p.grad = None

    def _restore_grads(self, add: bool) -> None:
        """Put the gradients set aside back: alone (after a failure) or plus this step's, as
        ``backward`` accumulates (in place, so the bits are those of a plain accumulation). With none set
        aside, after a failure, the parameters get no gradient back, as they had none."""
        aside, self._aside = getattr(self, "_aside", None), None
        if aside is None:
            return  # (the step failed before it took them: nothing was taken)
        if not aside:  # (there were none: this step's gradients are the gradients, or none after a failure)
            if not add:
                for p in self.params:
                    p.grad = None
            return
        with torch.no_grad():
            for p, old in zip(self.params, aside, strict=True):
                new = p.grad if add else None
                if old is None:
                    p.grad = new
                else:
                    if new is not None:
                        old.add_(new)
                    p.grad = old

    def _learn(self, run: "_Run") -> None:
        """What the first step that succeeded showed, for the steps after it (autograd runs the same graph
        in the same order every step, so they do the same work at the same moments):

        - pre-hooks go only on the backward nodes whose pre-hook had work to do (``run.worked``: a
          recompute, a page-in, a free of a managed node before them; not only bookkeeping). The others
          only advanced the schedule through bookkeeping, which the next pre-hook (or the end of the
          backward pass) replays as well, in the same order, so the planned bytes are counted alike.
          A schedule that recomputes early in the backward pass hooked every backward node after that.
        - The nodes that only read a managed node (packed to check autograd's reads of its storages)
          run without the saved-tensor hooks, unless their values are views of managed memory
          (``run.viewing``: their records are needed). The first step checked every read and fetched
          nothing unplanned; with prefetching page-ins, reads must wait for the disk, so they stay.
          For the same reason the packed nodes' saved tensors are then kept as they are, without a
          record to check each read against (:meth:`_Run._pack_unchecked`), and a managed node that owned
          only storages of its own (no view of another node's) finds them where the first step did: the
          same values and saved tensors, by position (``run.owned_sources``), without sorting out which
          of the others are constants, other nodes' or duplicates. When every packed node is such a node,
          no storage of an unmanaged node is looked up by key any more, so none is made known
          (``_tracking``), and the segments' code collects the autograd nodes to hook itself.
          Then, too, the managed and kept nodes that no other node holds (``run.shared``, ``run.viewing``)
          are handed over to autograd after the step's last use of them (:func:`_handovers`): their last
          frees become bookkeeping, and a pre-hook that had only such frees to do goes (on MobileNetV2 x2
          at half of checkpoint-all's peak, 6 of 13: each rerun's free and its inputs' frees).
        - Only the parameters and buffers that those nodes met (saved, or returned as values) need their
          storages looked up (:attr:`_Run.constant_keys`): the same code reads the same tensors every step.
          Their storages are still looked up on every step, since ``p.data = ...`` replaces one.
        - The schedule's last run of bookkeeping adds up to the same sums every step (:class:`_Tail`).

        Every pre-hook and every saved tensor under the hooks is a Python call (a few microseconds each on
        a busy cache): this is what the executor's own time follows once it has learnt."""
        self._learnt = True
        met = run.constants_met
        self._constants_met = [t for t in self.constants if _key(t.untyped_storage()) in met]
        packed = self._packed
        if not self.prefetch and run.n_unplanned == 0:
            packed = self._managed | frozenset(run.viewing)
            self._unchecked_reads = True
            self._owned_sources = {i: sources for i, sources in run.owned_sources.items() if sources is not None}
            self._tracking = not packed <= self._owned_sources.keys()
            self._owned_places = {
                i: tuple((True, s[1], 0) if s[0] == "pack" else (False, self._external[i].index(s[1]), s[2]) for s in sources)
                for i, sources in self._owned_sources.items()
            }
            self._hookless = self._without_hooks(run)
            handed = {
                k: use_and_free for k, use_and_free in self._handover_candidates.items()
                if k not in run.shared and k not in run.viewing and (k in self._kept or k in self._owned_sources)
            }
            if handed:
                after: dict[int, tuple[int, ...]] = {}
                for k, (use, _) in sorted(handed.items()):
                    after[use] = (*after.get(use, ()), k)
                self._handover, self._handed_frees = after, frozenset(free for _, free in handed.values())
                self._events, self._bookkeeping_end = _backward_runs(self)
                self._last_run = self._bookkeeping_end.index(len(self.schedule.ops))
        hook_at = frozenset(j for j, positions in run.worked.items() if not self._handed_frees.issuperset(positions))
        self._hook_at, self._packed_now = hook_at, packed
        gradients = {op.node for op in self.schedule.ops if self.binding.forward_of[op.node] is not None}
        worked = {op.node for p, op in enumerate(self.schedule.ops) if p >= self._backward_start and self._events[p] is None}
        self._stateless = frozenset(gradients - worked - hook_at)
        # (their code registers pre-hooks, switches the saved-tensor hooks and tracks storages as this showed)
        self._segments = _segments(self)

    # -- one step ---------------------------------------------------------------------------------
    def step(self, inputs: torch.Tensor | Sequence[torch.Tensor], targets: object, *, measure_memory: bool = False) -> ExecutionResult:
        """Run one training step; gradients are added to ``.grad`` as ``loss.backward()`` would.

        Its times are the whole call's (the step's set-up and clean-up too: the buffers' backup, the
        paging directory made and removed, the gradients put back), as a plain step timed from outside."""
        cpu_start, start = time.thread_time(), time.perf_counter()
        run = _Run(self, (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs), targets)
        # BatchNorm's running statistics change during the forward pass: kept to put back on failure
        # (:class:`_BufferBackup`)
        if self._buffer_backup is None or not self._buffer_backup.take():
            self._buffer_backup = _BufferBackup(self.buffers)
            self._backward_buffers = None  # (its reset reads the backup's copies: found again)
            self._buffer_backup.take()
        buffers = self._buffer_backup.copies
        peak = total_peak = None
        try:
            # autograd accumulates into .grad; the caller's gradients wait aside until the step succeeds.
            # Taken first, not before the backward pass: the optimizer's step or ``zero_grad`` has just read
            # every parameter, whose ``.grad`` is then found on a warm cache (after the forward pass, the loop
            # over MobileNetV2's 158 took ~35 us of a step)
            self._set_aside_grads()
            if measure_memory:
                with measure_allocations() as allocation, planned_kernels():
                    run.go()
                # (this step's gradients, not yet added to those set aside: _restore_grads)
                grads = [p.grad for p in self.params]
                total_peak = allocation.peak_bytes
                peak = allocation.peak_excluding(g.data_ptr() for g in grads if g is not None)
            else:
                with planned_kernels():  # (NOTE [kernel choice] in poetlab.kernels)
                    run.go()
        except BaseException:
            if buffers:
                _copy_buffers(self.buffers, buffers)
            self._restore_grads(add=False)
            raise
        finally:
            run.close()
        self._restore_grads(add=True)
        if not self._learnt:
            self._learn(run)
        if run.tail is not None and run.n_unplanned == 0:
            self._tail = run.tail  # (see _Tail)
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
        return ExecutionResult(
            loss=run.loss_value,
            wall_s=wall,
            cpu_s=cpu,
            paging_wall_s=run.store.wall_s if run.store else 0.0,
            paging_cpu_s=run.store.cpu_s if run.store else 0.0,
            peak_bytes=peak,
            total_peak_bytes=total_peak,
            planned_peak_bytes=run.planned_peak,
            bytes_written=run.store.bytes_written if run.store else 0,
            bytes_read=run.store.bytes_read if run.store else 0,
            n_computes=run.n_computes,
            n_recomputes=run.n_recomputes,
            n_pageouts=run.n_pageouts,
            n_pageins=run.n_pageins,
            n_unplanned=run.n_unplanned,
            n_skipped_ops=run.n_skipped,
            prefetch=self.prefetch,
            n_compresses=run.n_compresses,
            n_decompresses=run.n_decompresses,
            compressed_bytes=run.compressed_bytes,
            recompute_cpu_s=run.recompute_cpu_s,
        )


class _Run:
    """The state of one executed step."""

    # (slots, not an instance dict, as ScheduleExecutor has them: a step reads and writes its run's and its
    # executor's attributes throughout, on the cold caches its tensors leave. Both together, beside the
    # executor without them in one process (ab_execute.py, two runs of 400 rounds): MobileNetV2 x2 at 50%
    # -40 and -217 us a step, at 70% -43 and -60; the encoder x8 at 98.5% -15 and -26. The other way, the
    # run's counters and the nodes' states as plain objects whose starting values live on the class, took
    # MobileNetV2 x2 92-270 us a step longer)
    __slots__ = (
        "ex", "inputs", "targets", "state", "values", "constants", "records", "_constant_keys", "constants_met",
        "batch_keys", "store", "unmanaged_keys", "cursor", "current", "current_packs", "pending_own", "packs",
        "rng_before", "hooks", "seen_fns", "pending_hooks", "worked", "shared", "viewing", "owned_sources",
        "hookless", "loss", "loss_value", "planned", "planned_peak", "n_computes", "n_unplanned", "n_compresses",
        "recompute_cpu_s", "tail", "buffers_kept", "n_recomputes", "n_pageouts", "n_pageins", "n_skipped",
        "n_decompresses", "compressed_bytes",
    )

    def __init__(self, ex: ScheduleExecutor, inputs: tuple[torch.Tensor, ...], targets: object):
        self.ex = ex
        self.inputs = inputs
        self.targets = targets
        self.state = [_NodeState() for _ in range(ex.graph.n_nodes)]
        self.values: dict[str, object] = {}
        self.constants: dict[str, object] = {}
        self.records: dict[int, _Storage] = {}  # storage key -> record
        self._constant_keys: set[int] | None = None  # (built on first need: see constant_keys)
        self.constants_met: set[int] = set()  # keys of the constants met, while the executor learns
        self.batch_keys: set[int] = set()
        self.store: PageStore | None = None
        if ex._has_pageouts:
            self.store = PageStore(ex.paging_dir, prefetch=ex.prefetch, durable=ex.durable)
        # storage key -> the unmanaged node whose output it is, and a weak reference to the storage (_track_values)
        self.unmanaged_keys: dict[int, tuple[int, weakref.ref]] = {}
        self.cursor = 0
        self.current: int | None = None
        self.current_packs = 0
        self.pending_own: list[tuple[int, torch.Tensor]] = []
        self.packs: list[torch.Tensor] | None = None  # (every tensor the running node saved: _pack_unchecked)
        self.rng_before: torch.Tensor | None = None
        self.hooks: torch.autograd.graph.saved_tensors_hooks | object | None = None  # (on while a packed node runs)
        self.seen_fns: set[object] = set()
        # (backward node, the autograd nodes to hook for it) collected by a segment, hooked after it: one
        # pre-hook registered after another costs a few microseconds, one between the forward pass's
        # operations, on the cold cache they leave, 15-20 (_hook_pending)
        self.pending_hooks: list[tuple[int, tuple[object, ...]]] = []
        # backward nodes whose pre-hook had work to do, and the positions of the operations that had it
        # (ScheduleExecutor._learn)
        self.worked: dict[int, list[int]] = {}
        self.shared: set[int] = set()  # managed or kept nodes whose storages other nodes hold too (_handovers)
        self.viewing: set[int] = set()  # unmanaged nodes whose values are views of managed memory
        # the sources (_Storage.source) of the storages each managed node owned, None where it also held
        # another node's (ScheduleExecutor._learn)
        self.owned_sources: dict[int, tuple[tuple, ...] | None] = {}
        # where each of those nodes' storages are found without the saved-tensor hooks, None where some are
        # not (ScheduleExecutor._hookless)
        self.hookless: dict[int, tuple[tuple[tuple[str, str | None], ...], int] | None] = {}
        self.loss: torch.Tensor | None = None
        self.loss_value = math.nan
        self.planned = 0
        self.planned_peak = 0
        self.n_computes = self.n_recomputes = self.n_pageouts = self.n_pageins = 0
        self.n_unplanned = self.n_skipped = 0
        self.n_compresses = self.n_decompresses = self.compressed_bytes = 0
        self.recompute_cpu_s = 0.0
        self.tail: _Tail | None = None  # (what the last run of bookkeeping added up to: _advance_to_end)
        self.buffers_kept = False  # (the buffers of the nodes rerun in the backward pass: _rerun_buffers)

    @property
    def constant_keys(self) -> set[int]:
        """Keys of the storages no schedule frees or pages: parameters, buffers, targets, the batch. Built
        on first need, since a step that manages no node (checkpoint-all) never asks; once the executor
        has learnt which parameters and buffers its managed nodes meet, of those only (a few hundred
        lookups on a cold cache cost MobileNetV2 x2 about 1% of a step)."""
        if self._constant_keys is None:
            met = self.ex._constants_met
            constants = self.ex.constants if met is None else met
            self._constant_keys = {_key(t.untyped_storage()) for t in [*constants, *_tensors(self.targets)]}
            self._constant_keys |= self.batch_keys
        return self._constant_keys

    def _is_constant(self, key: int) -> bool:
        if key not in self.constant_keys:
            return False
        if not self.ex._learnt:
            self.constants_met.add(key)
        return True

    def close(self) -> None:
        self._end_hooks()  # (a step that failed while a packed node ran in a segment)
        if self.state:  # (graphless nodes' autograd functions hold their states, which may hold their outputs)
            for i in self.ex._graphless:
                self.state[i].first_values = self.state[i].rerun = None
        if self.store is not None:
            self.store.close()
        self.values.clear()
        self.constants.clear()
        self.records.clear()
        self.state.clear()
        # The autograd nodes we hooked hold pre-hooks that hold this run, and so do the tensors autograd
        # saved (their records): cycles through C++, which Python's collector cannot see. Drop our side
        # of them, the loss too (a backward pass that failed midway leaves its graph behind).
        self.seen_fns.clear()
        self.pending_hooks.clear()
        self.loss = None

    # -- driving the schedule -------------------------------------------------------------------
    def go(self) -> None:
        ops = self.ex.schedule.ops
        forward_of = self.ex.binding.forward_of
        segments = self.ex._segments
        # (the forward pass builds autograd's graph whatever the caller's mode: switched on once, by
        # torch.enable_grad's own call: the context manager's Python took ~10 us at the start of a step)
        grad_was = torch.is_grad_enabled()
        torch._C._set_grad_enabled(True)
        try:
            while self.cursor < len(ops):
                segment = segments.get(self.cursor)
                if segment is not None:
                    self._run_segment(segment)
                    self.cursor = segment.end
                    continue
                op = ops[self.cursor]
                if op.kind is OpKind.COMPUTE and forward_of[op.node] is not None:
                    break  # the first backward compute: autograd's engine takes over from here
                self._do(op)
                self.cursor += 1
        finally:
            torch._C._set_grad_enabled(grad_was)
        if self.loss is None:
            raise ExecutionError("the schedule computes no backward node after the loss; plan on the traced graph")
        # no forward code reads an unmanaged node any more (recomputes read managed ones only): what
        # autograd saved of them, it keeps; the rest goes now, as it would in a plain step
        holding = {self.ex._group_of[name] for name in self.values} | {i for i, _ in self.unmanaged_keys.values()}
        for i in holding - self.ex._managed - self.ex._kept - self.ex.binding.inputs:
            self._drop_values(i)
        rerun = self.ex._rerun_buffers()  # (on a failure, the step puts every buffer back as it was before it)
        reset = rerun.before_step is not None and self.ex._unchecked_reads
        if rerun.buffers:
            if reset:
                versions = [b._version for b in rerun.buffers] if self.ex._hookless else None
                _copy_buffers(rerun.buffers, rerun.before_step)  # type: ignore[arg-type]
                if versions is not None:
                    _set_versions(rerun.buffers, versions)  # (ScheduleExecutor._without_hooks)
            else:
                torch._foreach_copy_(rerun.kept, rerun.buffers)
            self.buffers_kept = True
        self.loss.backward()
        self.loss = None
        self._advance_to_end()
        if rerun.buffers and not reset:
            _copy_buffers(rerun.buffers, rerun.kept)
        if self.ex.prefetch:
            for record in self.records.values():
                self._wait(record)

    def _advance_to_backward(self, j: int) -> None:
        """Autograd is about to run a node of backward node ``j``: perform the schedule up to and
        including ``j``'s compute (nothing if it is done already)."""
        if self.state[j].computed:
            return
        position = self.ex._computed_at.get(j, -1)
        if position < self.cursor:
            raise ExecutionError(f"autograd ran {self.ex.graph.nodes[j].name} but the schedule never computes it; plan on the traced graph")
        if self.ex._learnt:  # (the same work from the same position every step: made once, :func:`_advance_plan`)
            plan = self.ex._plans.get((self.cursor, j))
            if plan is None:
                plan = self.ex._plans[(self.cursor, j)] = _advance_plan(self.ex, self.cursor, position + 1)
            plan(self)
            return
        worked = self._advance(position + 1)
        if worked:
            self.worked[j] = worked

    def _advance_to_end(self) -> None:
        """Perform the rest of the schedule after the backward pass; its last run of bookkeeping as the
        sums a step before added up (:class:`_Tail`), where they apply: nothing fetched unplanned, the
        same start. Otherwise replayed, and summed (``self.tail``, for the steps after) when it freed no
        storage."""
        start = max(self.cursor, self.ex._last_run)
        self._advance(start)
        tail = self.ex._tail
        if tail is not None and tail.start == start and self.n_unplanned == 0:
            self.n_computes += tail.n_computes
            self.n_recomputes += tail.n_recomputes
            self.n_skipped += tail.n_skipped
            self.planned_peak = max(self.planned_peak, self.planned + tail.rise)
            self.planned += tail.planned
        else:
            counts, planned, peak = (self.n_computes, self.n_recomputes, self.n_skipped), self.planned, self.planned_peak
            self.planned_peak = planned
            freed = self._replay(self.ex._events[start:])
            if not freed:
                self.tail = _Tail(start, self.n_computes - counts[0], self.n_recomputes - counts[1], self.n_skipped - counts[2], self.planned - planned, self.planned_peak - planned)
            self.planned_peak = max(peak, self.planned_peak)
        self.cursor = len(self.ex.schedule.ops)

    def _advance(self, stop: int) -> list[int]:
        """Perform the schedule's operations up to position ``stop`` (exclusive): runs of bookkeeping at
        once (:func:`_backward_runs`), the others one by one, each followed by the hand-overs due after it
        (:func:`_handovers`). The positions of those that had work to do (more than counting: an operation of
        :meth:`_do`, or the frees of a run of bookkeeping that freed a storage)."""
        ops, events, ends, handover = self.ex.schedule.ops, self.ex._events, self.ex._bookkeeping_end, self.ex._handover
        worked: list[int] = []
        while self.cursor < stop:
            end = min(ends[self.cursor], stop)
            if end > self.cursor:
                if self._replay(events[self.cursor:end]):
                    worked += [p for p in range(self.cursor, end) if ops[p].kind is OpKind.FREE]
                self.cursor = end
            else:
                self._do(ops[self.cursor])
                worked.append(self.cursor)
                for k in handover.get(self.cursor, ()):
                    self._hand_over(k)
                self.cursor += 1
        return worked

    def _rerun(self, i: int) -> None:
        """A compute of forward node ``i`` that was computed before (:meth:`_do`, a plan)."""
        self.n_computes += 1
        self.n_recomputes += 1
        self._recompute(i)

    def _do(self, op: Op) -> None:
        i = op.node
        st = self.state[i]
        if op.kind in _COMPRESSION_OPS:
            self._compression_op(op)
            return
        if op.kind is OpKind.COMPUTE:
            if self.ex.binding.forward_of[i] is None and st.computed:
                self._rerun(i)
                return
            self.n_computes += 1
            if self.ex.binding.forward_of[i] is not None:  # autograd computes it; we only follow
                self.n_skipped += int(st.computed)  # a gradient cannot be recomputed outside autograd
                self._set_in_ram(i, True)
                st.computed = True
            else:
                self._first_compute(i)
            return
        if self.ex.binding.forward_of[i] is not None or i in self.ex.binding.inputs:
            # Gradients live in autograd's engine, which frees each after its last use as the schedule
            # does; paging one is not possible, nor freeing the caller's batch: those are counted.
            self.n_skipped += int(op.kind is not OpKind.FREE or i in self.ex.binding.inputs)
            if op.kind is not OpKind.PAGE_OUT:
                self._set_in_ram(i, op.kind is OpKind.PAGE_IN)
            return
        if op.kind is OpKind.FREE:
            self._free(i)
        elif op.kind is OpKind.PAGE_OUT:
            assert self.store is not None
            for record in st.owned:
                self._wait(record)
                if not record.materialized:
                    raise ExecutionError(f"the schedule pages out {self.ex.graph.nodes[i].name}, which is not in RAM")
            self.store.write(str(i), [record.storage for record in st.owned])  # (one file: _page_in)
            st.paged = st.owned
            st.on_flash = True
            self.n_pageouts += 1
        else:
            if not st.on_flash:
                raise ExecutionError(f"the schedule pages in {self.ex.graph.nodes[i].name}, which was never paged out")
            self._page_in(i)
            self.n_pageins += 1

    def _run_segment(self, segment: _Segment) -> None:
        """Run a :class:`_Segment`'s code, then the bookkeeping after its last call."""
        reader = self.ex.graph.nodes[self.ex.schedule.ops[segment.start].node].name
        env = [self._resolve(d, {}, False, reader) for d in segment.deps]
        for i in segment.freed_before:  # handed over: the generated code drops them at their last use
            self._drop_values(i)
        results = segment.run(env, self)  # (grad mode: go)
        if self.pending_hooks:
            self._hook_pending()
        values = dict(zip(segment.outputs, results, strict=True))
        del results
        self.values.update(values)
        for i, names in segment.escaping:  # (only values read later can be seen again: by storage key)
            self._track(i, [values[name] for name in names])
        self._replay(segment.events)

    def _free(self, i: int) -> None:
        """The schedule frees forward node ``i`` (not the batch), as :meth:`_do` does."""
        self._set_in_ram(i, False)
        if i not in self.ex._managed:
            self._drop_values(i)
            self.state[i].first_values = None  # (a graphless node's: _graphless_in_segment)

    def _do_at(self, position: int) -> None:
        self._do(self.ex.schedule.ops[position])

    def _track(self, i: int, external: Sequence[object]) -> None:
        self._track_values(i, _storages(external))

    def _replay(self, events: Sequence[tuple[int, int]]) -> bool:
        """What :meth:`_do` does for computes done elsewhere and frees that need no work (the events
        of :func:`_bookkeeping`), in one loop: the count of the planned bytes and of the storages' holders.
        Whether a node holding storages was among them (a storage may have been freed)."""
        nbytes, state = self.ex._output_bytes, self.state
        planned, peak = self.planned, self.planned_peak
        held = False
        for i, what in events:  # (_set_in_ram, inlined)
            st = state[i]
            compute = what == _COMPUTE or what == _RECOMPUTED_BATCH
            if compute:
                self.n_computes += 1
                self.n_recomputes += what == _RECOMPUTED_BATCH
                st.computed = True
            elif what == _SKIPPED_FREE:
                self.n_skipped += 1
            if st.in_ram != compute:
                st.in_ram = compute
                if compute:
                    planned += nbytes[i]
                    if planned > peak:
                        peak = planned
                else:
                    planned -= nbytes[i]
                if st.held:
                    self._count_holders(st, compute)
                    held = True
        self.planned, self.planned_peak = planned, peak
        return held

    def _replay_summed(self, k: int) -> None:
        """:meth:`_replay` of the learnt generated code's ``k``-th run (:class:`_SummedReplay`): its sums
        once known, and the states of its stateful nodes set; event by event (and summed, for the steps
        after) otherwise, or after an unplanned fetch."""
        replay = self.ex._summed[k]
        sums = replay.sums
        if sums is None or self.n_unplanned:
            counts, planned, peak = (self.n_computes, self.n_recomputes, self.n_skipped), self.planned, self.planned_peak
            self.planned_peak = planned
            freed = self._replay(replay.events)
            rise = self.planned_peak - planned
            self.planned_peak = max(peak, self.planned_peak)
            if not freed and not self.n_unplanned:
                replay.sums = (self.n_computes - counts[0], self.n_recomputes - counts[1], self.n_skipped - counts[2], self.planned - planned, rise)
            return
        n_computes, n_recomputes, n_skipped, change, rise = sums
        self.n_computes += n_computes
        self.n_recomputes += n_recomputes
        self.n_skipped += n_skipped
        if self.planned + rise > self.planned_peak:
            self.planned_peak = self.planned + rise
        self.planned += change
        state = self.state
        for i, compute in replay.stateful:
            st = state[i]
            if compute:
                st.computed = True
            if st.in_ram != compute:
                st.in_ram = compute
                if st.held:
                    self._count_holders(st, compute)

    def _compression_op(self, op: Op) -> None:
        """Compress node ``op.node``'s storages beside the dense ones, decompress them back into the
        emptied storages, or drop the compressed copies. Gradients and the caller's batch are not
        compressed (counted as skipped; a decompress of one only marks it in RAM, as a page-in does)."""
        i = op.node
        st = self.state[i]
        name = self.ex.graph.nodes[i].name
        if self.ex.binding.forward_of[i] is not None or i in self.ex.binding.inputs:
            self.n_skipped += 1
            if op.kind is OpKind.DECOMPRESS:
                self._set_in_ram(i, True)
            return
        if op.kind is OpKind.COMPRESS:
            if not st.in_ram or any(record.packed is not None for record in st.owned):
                raise ExecutionError(f"the schedule compresses {name}, which is not in RAM or is compressed already")
            for record in st.owned:
                self._wait(record)
                record.packed = compress(as_words(record.storage))
                self.planned += record.packed.nbytes
                self.compressed_bytes += record.packed.nbytes
            self.planned_peak = max(self.planned_peak, self.planned)
            self.n_compresses += 1
        elif op.kind is OpKind.DECOMPRESS:
            if not st.owned or any(record.packed is None for record in st.owned):
                raise ExecutionError(f"the schedule decompresses {name}, which has no compressed copy")
            for record in st.owned:
                self._wait(record)
                if not record.materialized:  # (still materialized when a view in RAM holds it)
                    record.storage.resize_(record.nbytes)
                    as_words(record.storage).copy_(decompress(record.packed))
            self._set_in_ram(i, True)
            self.n_decompresses += 1
        else:
            if any(record.packed is None for record in st.owned):
                raise ExecutionError(f"the schedule frees a compressed copy of {name} that does not exist")
            for record in st.owned:
                self.planned -= record.packed.nbytes
                record.packed = None

    def _track_values(self, i: int, storages: Sequence[torch.UntypedStorage]) -> None:
        """Unmanaged node ``i``'s values live in ``storages``: a managed node that saves or views them finds
        their producer (:meth:`_unmanaged_producer`; :meth:`_drop_values` forgets them).

        Each is known by its key with a weak reference to it (torch keeps a storage's Python object as long
        as the storage lives): a segment's code drops a value at its last use, which may come before the
        schedule's free of it, and a storage made after the value's died may have its key (the address of
        a freed StorageImpl is the next one's, often). Taken for the dead node's, a packed node's own
        output would be held by it, and emptied at its free."""
        keys = [_key(storage) for storage in storages]
        self.state[i].unmanaged_keys = tuple(keys)
        for key, storage in zip(keys, storages, strict=True):
            self.unmanaged_keys[key] = (i, weakref.ref(storage))

    def _unmanaged_producer(self, key: int) -> int | None:
        """The unmanaged node whose value lives in the storage of ``key`` (:meth:`_track_values`), if any:
        not one whose storage of that key has died since (the key is now another storage's)."""
        entry = self.unmanaged_keys.get(key)
        if entry is None:
            return None
        if entry[1]() is None:
            del self.unmanaged_keys[key]
            return None
        return entry[0]

    def _drop_values(self, i: int) -> None:
        """Forget unmanaged node ``i``'s values: their memory goes when autograd no longer needs it."""
        for name in self.ex._external[i]:
            self.values.pop(name, None)
        # (the keys go too: once its memory is freed, a new storage may come to have the same key)
        for key in self.state[i].unmanaged_keys:
            entry = self.unmanaged_keys.get(key)
            if entry is not None and entry[0] == i:
                del self.unmanaged_keys[key]
        self.state[i].unmanaged_keys = ()

    def _hand_over(self, i: int) -> None:
        """The step has no more use for node ``i`` (:func:`_handovers`): drop its values and the records of
        its storages, leaving them to autograd, which lets go of them after the last backward node that
        reads them. Its free is then counted only; it stays in RAM for the planned bytes until then."""
        st = self.state[i]
        if self.ex._tracking:  # (else none was entered: _finish_owned)
            for record in st.owned:
                del self.records[_key(record.storage)]
        st.owned = st.held = st.paged = ()
        self._drop_values(i)

    def _set_in_ram(self, i: int, in_ram: bool) -> None:
        """Node ``i`` enters or leaves RAM: count its storages' users, free those nobody holds."""
        st = self.state[i]
        if st.in_ram == in_ram:
            return
        st.in_ram = in_ram
        self.planned += (1 if in_ram else -1) * self.ex._output_bytes[i]
        self.planned_peak = max(self.planned_peak, self.planned)
        self._count_holders(st, in_ram)

    def _count_holders(self, st: _NodeState, in_ram: bool) -> None:
        """A node holding storages entered or left RAM: free the storages nobody holds any more.

        Once nothing is tracked (``ScheduleExecutor._tracking``), every storage with a record is its
        owner's alone (a node that holds another's keeps the tracking on: :meth:`ScheduleExecutor._learn`),
        so none is counted: each goes when its owner leaves RAM. (The encoder's layer owns 21; a count
        took ~1 us a storage on the cold cache, three times a step: in at its compute and its rerun, out
        at its free.)"""
        tracking = self.ex._tracking
        if in_ram and not tracking:
            return
        for record in st.held:
            if tracking:
                record.refs += 1 if in_ram else -1
                if record.refs:
                    continue
            if record.pending is not None:  # (a page-in in flight: _wait)
                self._wait(record)
            record.storage.resize_(0)

    def _page_in(self, i: int) -> None:
        """Read back node ``i``'s storages that are not in RAM (the others are held by a view that stayed)
        from the one file its last page-out wrote them to, one after the other."""
        st = self.state[i]
        assert self.store is not None
        parts, offset = [], 0
        for record in st.paged:
            if not record.materialized:
                record.storage.resize_(record.nbytes)
                parts.append((offset, record))
            offset += record.nbytes
        if parts:
            pending = self.store.read_into(str(i), [(at, record.storage) for at, record in parts])
            for _, record in parts:
                record.pending = pending
        self._set_in_ram(i, True)

    @staticmethod
    def _wait(record: _Storage) -> None:
        if record.pending is not None:
            future, record.pending = record.pending, None
            future.result()

    def _ensure(self, record: _Storage, reader: str) -> None:
        """``record``'s bytes must be in RAM now: they are (possibly once a prefetch lands), or the
        schedule did not keep them and we fail (strict) or fetch them (counted as unplanned)."""
        if record.pending is None and record.refs > 0:
            return  # held by a node in RAM, no read in flight: materialized (the fast path)
        self._wait(record)
        if record.materialized:
            return
        owner = record.owner
        st = self.state[owner]
        name = self.ex.graph.nodes[owner].name
        if self.ex.strict:
            where = "on flash only" if st.on_flash else "freed"
            raise ExecutionError(f"{reader} reads {name}, which the schedule does not hold in RAM ({where}); replay the schedule with poetlab.simulate")
        self.n_unplanned += 1
        if st.on_flash:
            self._page_in(owner)
            self._wait(record)
        else:
            self._recompute(owner)
        # it now counts as in RAM until the schedule's next free of it (or the end of the step)

    def _need(self, i: int, reader: str) -> None:
        for record in self.state[i].held:
            self._ensure(record, reader)

    # -- forward nodes --------------------------------------------------------------------------
    def _resolve(self, dep: fx.Node, local: dict[str, object], detach: bool, reader: str) -> object:
        if dep.name in local:
            return local[dep.name]
        group = self.ex._group_of.get(dep.name)
        if group is not None:
            if not self.ex._unchecked_reads:  # (once they are, the first step has found every read's bytes: _learn)
                self._need(group, reader)
            value = self.values.get(dep.name, _MISSING)
            if value is _MISSING:  # (an unmanaged node's value goes at its free: the schedule freed it)
                raise ExecutionError(f"{reader} reads {self.ex.graph.nodes[group].name}, which the schedule does not hold in RAM (freed); replay the schedule with poetlab.simulate")
            return _detached(value) if detach else value
        if dep.name not in self.constants:  # get_attr, or a node computing no tensor (a size, ...)
            self.constants[dep.name] = self._run_fx(dep, lambda d: self._resolve(d, local, detach, reader))
        return self.constants[dep.name]

    def _run_fx(self, n: fx.Node, lookup: Callable[[fx.Node], object]) -> object:
        args = fx.node.map_arg(n.args, lookup)
        kwargs = fx.node.map_arg(n.kwargs, lookup)
        if n.op == "call_module":
            return self.ex.modules[n.target](*args, **kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        if n.op == "call_method":
            obj, *rest = args
            return getattr(obj, n.target)(*rest, **kwargs)
        if n.op == "get_attr":
            return _fetch_attr(self.ex.gm, str(n.target))
        if n.op == "placeholder":
            return self.inputs[self.ex.placeholders.index(n)]
        raise ExecutionError(f"cannot run fx node {n.name} ({n.op})")

    def _run_group(self, i: int, rerun: bool) -> tuple[dict[str, object], object]:
        """Run forward node ``i``'s fx nodes; returns (values of its external fx nodes, its output). A rerun
        reads its inputs detached and runs the reruns' code (``ScheduleExecutor._rerun_code``)."""
        binding = self.ex.binding
        reader = self.ex.graph.nodes[i].name
        if i == binding.loss:
            output = binding.output_arg
            if isinstance(output, fx.Node):  # (the usual single output: without map_arg's Python work)
                model_out = self._resolve(output, {}, rerun, reader)
            else:
                model_out = fx.node.map_arg(output, lambda d: self._resolve(d, {}, rerun, reader))
            return {}, self.ex.loss_fn(model_out, self.targets)
        compiled = (self.ex._rerun_code if rerun else self.ex._compiled)[i]
        if compiled is not None:
            results = compiled.run(*[self._resolve(d, {}, rerun, reader) for d in compiled.deps])
            return dict(zip(self.ex._external[i], results, strict=True)), results[-1]
        local: dict[str, object] = {}
        out: object = None
        for m in binding.members[i]:
            out = local[m.name] = self._run_fx(m, lambda d: self._resolve(d, local, rerun, reader))
        return {name: local[name] for name in self.ex._external[i]}, out

    def _first_compute(self, i: int) -> None:
        if i in self.ex.binding.inputs:
            self._take_batch(i)
            return
        self._begin(i, i in self.ex._packed_now)
        if i in self.ex._graphless:  # (_begin and _finish keep its random state, as any node's)
            values, out = self._run_graphless(i)
        elif torch.is_grad_enabled():  # (the forward pass: go; if it fails, close() switches the hooks off)
            values, out = self._run_group(i, rerun=False)
        else:
            with torch.enable_grad():
                values, out = self._run_group(i, rerun=False)
        self.values.update(values)
        if i == self.ex.binding.loss:
            self.loss = out
            self.loss_value = out.item()
        self._finish(i, values, out if i == self.ex.binding.loss else list(values.values()))

    def _run_graphless(self, i: int) -> tuple[dict[str, object], object]:
        """:meth:`_run_group` of a graphless node's first run (:class:`_GraphlessRun`)."""
        compiled, reader = self.ex._compiled[i], self.ex.graph.nodes[i].name
        assert compiled is not None
        results = _GraphlessRun.apply(self.state[i], compiled.run, self.ex._trigger, *[self._resolve(d, {}, False, reader) for d in compiled.deps])
        return dict(zip(self.ex._external[i], results, strict=True)), results[-1]

    def _graphless_in_segment(self, i: int, *deps: object) -> tuple[object, ...]:
        """A graphless node's first run in a segment's code (:class:`_GraphlessRun`), its random state kept
        where it draws random numbers (learnt on the first step, as :meth:`_finish` does), for its rerun;
        the rest of its compute is an unmanaged node's."""
        st = self.state[i]
        draws = self.ex.draws_rng.get(i)
        before = torch.get_rng_state() if draws is not False else None
        results = _GraphlessRun.apply(st, self.ex._compiled[i].run, self.ex._trigger, *deps)  # type: ignore[union-attr]
        # (held until its free: the segment's code drops them at their last use, and a storage gone before
        # then would leave its key, made known while the first step tracks storages, to the next one made there)
        st.first_values = results
        if draws is None:
            draws = self.ex.draws_rng[i] = not torch.equal(before, torch.get_rng_state())  # type: ignore[arg-type]
        st.rng_state = before if draws else None
        return results

    def _compute_loss(self, i: int, model_out: object) -> None:
        """The loss node ``i``'s first compute in a segment, on the model's outputs: what
        :meth:`_first_compute` does for an unpacked loss, in one call."""
        self.loss = loss = self.ex.loss_fn(model_out, self.targets)
        self.loss_value = loss.item()
        self.n_computes += 1
        self.state[i].computed = True
        self._set_in_ram(i, True)
        if self.ex.binding.backward_of_forward.get(i) in self.ex._hook_at:
            self._hook_backward(i, loss, defer=True)

    def _take_batch(self, i: int) -> None:
        """Input node ``i`` (placeholders only): the caller's batch, never freed or paged, whose storages
        count as constants. Taken as it is, without the general path (~55 us against ~20 us on the cold
        cache at the start of a step: 0.7% of the encoder x8's)."""
        values = {name: self.inputs[k] for name, k in self.ex._batch_of[i]}
        self.values.update(values)
        if self.ex._tracking:  # (else no storage is looked up by key: _learn)
            storages = _storages(values.values())
            self.batch_keys.update(_key(storage) for storage in storages)
            if self._constant_keys is not None:
                self._constant_keys |= self.batch_keys
            self._track_values(i, storages)
        self.state[i].computed = True
        self._set_in_ram(i, True)

    def _begin(self, i: int, packed: bool) -> None:
        """Forward node ``i`` is about to run for the first time: keep the RNG state before it (while it
        is not known whether the node draws random numbers) and, for a packed node, switch autograd's
        saved-tensor hooks on (:meth:`_finish` switches them off)."""
        self.rng_before = torch.get_rng_state() if self.ex.draws_rng.get(i) is not False else None
        self.current, self.current_packs, self.pending_own = i, 0, []
        if packed:
            if self.ex._unchecked_reads:
                self.packs = []
                self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_unchecked, _unpack_unchecked)
            else:
                self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self.hooks.__enter__()

    def _begin_owned(self, i: int) -> None:
        """:meth:`_begin` for a managed node that finds its storages where the first step did, nothing
        tracked (:meth:`_finish_owned`): the RNG state only where the node draws random numbers, and the
        saved-tensor hooks pushed directly (:data:`_push_saved_hooks`)."""
        self.rng_before = torch.get_rng_state() if self.ex.draws_rng[i] else None
        self.current, self.packs = i, []
        _push_saved_hooks(self._pack_unchecked, _unpack_unchecked)
        self.hooks = _PUSHED

    def _finish_owned(self, i: int, external: list[object]) -> None:
        """:meth:`_finish_in_segment` for such a node (:meth:`_begin_owned`). Its storages are taken
        from their places among its saved tensors and values (``ScheduleExecutor._owned_places``), and
        not entered in :attr:`records` by key: once nothing is tracked, nothing looks one up (the
        checked reads and the sorting out of other nodes' storages do; :meth:`ScheduleExecutor._learn`).
        Of :meth:`_finish`'s ~25 us a node on the cold cache a forward pass leaves (MobileNetV2 x2),
        about a third was that and the general path's dispatch. The hooks it pushed are popped and it
        enters RAM here, without :meth:`_end_hooks` and :meth:`_set_in_ram` (nothing to count: not
        tracking, :meth:`_count_holders`); the segment's code collects its autograd nodes to hook."""
        _pop_saved_hooks()  # type: ignore[misc]
        self.hooks = self.current = None
        packs, self.packs = self.packs, None
        st = self.state[i]
        st.n_packs = len(packs)  # type: ignore[arg-type]
        st.rng_state = self.rng_before
        self.n_computes += 1
        st.owned = st.held = self._learnt_storages(i, packs, external)  # type: ignore[arg-type]
        st.computed = st.in_ram = True
        self.planned += self.ex._output_bytes[i]
        if self.planned > self.planned_peak:
            self.planned_peak = self.planned

    def _finish_hookless(self, i: int, found: tuple[torch.Tensor, ...]) -> None:
        """:meth:`_finish_owned` for a managed node that ran without the saved-tensor hooks
        (``ScheduleExecutor._hookless``): ``found`` has the tensors whose storages it owns, in the order of
        ``ScheduleExecutor._owned_sources``, taken by the segment's code from its fx values and from what
        their autograd nodes saved (``grad_fn._saved_*``). Autograd keeps its saved tensors as they are:
        freeing one empties the storage it shares with them, and a rerun's bytes are swapped into it.
        Pushing the hooks costs a Python call per saved tensor as autograd saves it and another as it reads
        it back (a Conv+BatchNorm+ReLU6 group saves 9); the group's code reads the 2 statistics BatchNorm
        saved from its autograd node instead (the rest are its fx values). Such a group run forward and
        backward alone, warm: 33 us beyond a plain pass under the hooks, 14 us with all four of its
        tensors read from its autograd nodes (``README``: the A/B on whole steps)."""
        st = self.state[i]
        st.n_packs = self.ex._hookless[i][1]
        self.n_computes += 1
        st.owned = st.held = tuple(
            _Storage(storage, storage.nbytes(), i, source)
            for storage, source in zip([t.untyped_storage() for t in found], self.ex._owned_sources[i], strict=True)
        )
        st.computed = st.in_ram = True
        self.planned += self.ex._output_bytes[i]
        if self.planned > self.planned_peak:
            self.planned_peak = self.planned

    def _learnt_storages(self, i: int, packs: list[torch.Tensor], external: list[object]) -> tuple[_Storage, ...]:
        """Records of the storages managed node ``i`` owns, taken where the first step found them
        (``ScheduleExecutor._owned_places``): among the tensors it saved (``packs``) and its external
        values (``external``, in the order of ``ScheduleExecutor._external``)."""
        owned = []
        for (from_pack, index, k), source in zip(self.ex._owned_places[i], self.ex._owned_sources[i], strict=True):
            t = packs[index] if from_pack else external[index]
            if not isinstance(t, torch.Tensor):
                t = _tensors(t)[k]
            storage = t.untyped_storage()  # type: ignore[union-attr]
            owned.append(_Storage(storage, storage.nbytes(), i, source))
        return tuple(owned)

    def _end_hooks(self) -> None:
        hooks, self.hooks, self.current = self.hooks, None, None
        if hooks is _PUSHED:
            _pop_saved_hooks()
        elif hooks is not None:
            hooks.__exit__(None, None, None)

    def _finish_in_segment(self, i: int, external: Sequence[object], members: tuple[object, ...] | None = None) -> None:
        self.n_computes += 1
        self._finish(i, dict(zip(self.ex._external[i], external, strict=True)), list(external), in_segment=True)
        if members is not None and self.owned_sources.get(i) is not None:
            self.hookless[i] = self._hookless_places(i, members)

    def _finish(self, i: int, values: dict[str, object], hooked: object, in_segment: bool = False) -> None:
        """Forward node ``i`` has run (values: its external fx nodes'): hooks off, then record the
        storages it owns (its values' new storages and those autograd saved that nobody else made), count
        it in RAM and hook its backward node (on ``hooked``, its outputs) where the schedule needs it."""
        self._end_hooks()
        st = self.state[i]
        # (with unchecked reads, ``packs`` has every saved tensor, sorted out below rather than as it was saved)
        packs, self.packs = self.packs, None
        pending, self.pending_own = self.pending_own, []
        st.n_packs = self.current_packs if packs is None else len(packs)
        draws = self.ex.draws_rng.get(i)
        if draws is None:
            draws = self.ex.draws_rng[i] = not torch.equal(self.rng_before, torch.get_rng_state())
        if draws:
            st.rng_state = self.rng_before  # the node draws random numbers (dropout): replay them on a rerun
        managed = i in self.ex._managed
        sources = self.ex._owned_sources.get(i) if packs is not None else None
        tracking = self.ex._tracking
        storages = _storages(values.values()) if tracking and not managed else []
        if sources is not None:
            st.owned = st.held = self._learnt_storages(i, packs, list(values.values()))  # type: ignore[arg-type]
            if tracking:  # (else nothing looks them up: _finish_owned)
                self.records.update((_key(record.storage), record) for record in st.owned)
        elif not managed and (not tracking or not any(_key(storage) in self.records for storage in storages)):
            # unmanaged, and no view of a managed node's memory (learnt, when not tracking: nodes that view
            # one are packed, _learn): autograd and reference counting free it
            if tracking:
                self._track_values(i, storages)
        else:
            if not managed:
                self.viewing.add(i)
            candidates = [(t, ("value", name, k)) for name, value in values.items() for k, t in enumerate(_tensors(value))]
            candidates += [(t, ("pack", position)) for position, t in (pending if packs is None else enumerate(packs))]
            held: dict[int, _Storage] = {}
            own_only = managed
            for t, source in candidates:
                storage = t.untyped_storage()
                key = _key(storage)
                if key in held:
                    continue
                record = self.records.get(key)
                if record is not None and source[0] == "pack":
                    continue  # another node's storage that autograd saved: that node owns and holds it
                if record is None:
                    if self._is_constant(key):
                        continue
                    producer = self._unmanaged_producer(key)
                    if producer is not None and source[0] == "pack":
                        continue  # autograd saved an unmanaged node's output: not ours to free
                    if producer is not None:  # a view of an unmanaged node's output: that node owns it
                        record = self._adopt(producer, storage)
                        own_only = False
                    else:
                        record = _Storage(storage, storage.nbytes(), i, source)
                        st.owned += (record,)
                    self.records[key] = record
                elif record.owner != i:
                    own_only = False  # (a view of another node's storage)
                    self.shared.add(record.owner)
                held[key] = record
            st.held = tuple(held.values())
            if managed and not self.ex._learnt:
                self.owned_sources[i] = tuple(record.source for record in st.owned) if own_only else None
        st.computed = True
        self._set_in_ram(i, True)
        if self.ex.binding.backward_of_forward.get(i) in self.ex._hook_at:
            self._hook_backward(i, hooked, defer=in_segment)

    def _hookless_places(self, i: int, members: tuple[object, ...]) -> tuple[tuple[tuple[str, str | None], ...], int] | None:
        """Where managed node ``i``'s storages (``st.owned``, just recorded by the first step) are found
        without the saved-tensor hooks: each one the storage of one of its fx values (``(name, None)``) or
        of a tensor that such a value's autograd node saved (``(name, "_saved_...")``), and how many tensors
        it saved (``n_packs``: its reruns are checked against it); None if a storage is not found,
        or if the node draws random numbers (its RNG state is kept as the hooks are switched on) or owns
        an empty storage (whose address says nothing). Read through the checked unpack hook, in strict mode
        only (a non-strict read of a storage not in RAM would fetch it)."""
        st = self.state[i]
        owned = st.owned
        if not self.ex.strict or self.ex.draws_rng.get(i) or not owned or any(r.nbytes == 0 for r in owned) or st.n_packs == 0:
            return None
        where: dict[int, tuple[str, str | None]] = {}
        names = [m.name for m in self.ex.binding.members[i]]
        for name, value in zip(names, members, strict=True):
            if isinstance(value, torch.Tensor):
                where.setdefault(_key(value.untyped_storage()), (name, None))
        for name, value in zip(names, members, strict=True):
            fn = value.grad_fn if isinstance(value, torch.Tensor) else None
            for attr in sorted(a for a in dir(fn) if a.startswith("_saved_")) if fn is not None else ():
                try:
                    saved = getattr(fn, attr)
                except (RuntimeError, ExecutionError):
                    continue
                if isinstance(saved, torch.Tensor):
                    where.setdefault(_key(saved.untyped_storage()), (name, attr))
        places = tuple(where.get(_key(record.storage)) for record in owned)
        return None if None in places else (places, st.n_packs)  # type: ignore[return-value]

    def _adopt(self, producer: int, storage: torch.UntypedStorage) -> _Storage:
        """A managed node's output shares unmanaged ``producer``'s memory (a view, an identity): the
        storage gets a record owned by the producer, held by it while it is in RAM, so that it is freed
        only when neither needs it."""
        st = self.state[producer]
        self.shared.add(producer)
        record = _Storage(storage, storage.nbytes(), producer, ("value", self.ex._external[producer][-1], 0))
        st.owned += (record,)
        st.held += (record,)
        if st.in_ram:
            record.refs += 1
        return record

    def _hook_backward(self, i: int, value: object, defer: bool = False) -> None:
        """A pre-hook on the autograd nodes of forward node ``i``'s outputs (``value``), to drive the
        schedule; registered after the segment that runs ``i`` when ``defer`` (:meth:`_hook_pending`). The
        engine runs a group's autograd nodes one after another in decreasing creation order, so the
        output's node, created last, is the first of the group to run."""
        j = self.ex.binding.backward_of_forward.get(i)
        if j is None:
            return
        if not self.ex._learnt and isinstance(value, list):
            self.ex._tensor_valued[i] = all(isinstance(v, torch.Tensor) for v in value)
        self.pending_hooks.append((j, tuple(t.grad_fn for t in _tensors(value))))
        if not defer:
            self._hook_pending()

    def _hook_pending(self) -> None:
        """Register the pre-hooks collected in :attr:`pending_hooks` (each autograd node once)."""
        pending, self.pending_hooks = self.pending_hooks, []
        hooks: dict[int, Callable[..., None]] = {}
        for j, fns in pending:
            hook = hooks.get(j)
            if hook is None:
                hook = hooks[j] = lambda *_, j=j: self._advance_to_backward(j)
            for fn in fns:
                if fn is not None and fn not in self.seen_fns:
                    self.seen_fns.add(fn)
                    fn.register_prehook(hook)

    def _recompute(self, i: int) -> None:
        """Rerun forward node ``i`` on its inputs and put the fresh bytes into its emptied storages."""
        st = self.state[i]
        if i in self.ex.binding.inputs:  # the caller's batch never left: nothing to rerun
            self._set_in_ram(i, True)
            return
        # the buffers it updates a second time (_node_buffers: not BatchNorm's, whose stand-ins write none)
        # are put back after it; in the backward pass, once after it (ScheduleExecutor._rerun_buffers)
        kept = self.buffers_kept and i in self.ex._rerun_in_backward
        buffers, backup = ([], []) if kept else self.ex._group_buffers(i)
        if buffers:
            torch._foreach_copy_(backup, buffers)
        # the buffers it writes, whose versions go back after it where it leaves them as they were saved: put
        # back here, or reset before the backward pass (ScheduleExecutor._without_hooks); not those kept
        # and put back after the backward pass
        touched = None
        if self.ex._hookless and not kept:
            touched = buffers
        elif self.ex._hookless and self.ex._backward_buffers.before_step is not None:  # type: ignore[union-attr]
            touched = self.ex._group_buffers(i)[0]
        versions = [b._version for b in touched] if touched else None
        # The pack hook is ``recorded.append``: only the tensor is wanted (its storage is what the rerun made),
        # and the rerun's graph is never run backward, so autograd keeps nothing (append's None). Handing
        # ``t`` back would leak: a node that saves its own output (ReLU, BatchNorm's statistics) would hold it
        # while it holds the node, a cycle through C++ that Python's collector cannot break, pinning the
        # rerun's inputs' memory on every step. (A C method, not a Python function: no frame per tensor.)
        recorded: list[torch.Tensor] = []
        rng_after = None
        if st.rng_state is not None:  # (what torch.random.fork_rng does on the CPU, without its overhead)
            rng_after = torch.get_rng_state()
            torch.set_rng_state(st.rng_state)
        graphless = i in self.ex._graphless
        start = time.thread_time()
        grad_was = torch.is_grad_enabled()  # (off in the backward pass)
        if not graphless:
            _push_saved_hooks(recorded.append, _never_unpacked)
        try:
            torch._C._set_grad_enabled(True)  # (torch.enable_grad's own call, without its two Python calls)
            if graphless:  # (its graph is kept: autograd runs it backward, _GraphlessRun.backward)
                compiled, reader = self.ex._rerun_code[i], self.ex.graph.nodes[i].name
                inputs = [self._resolve(d, {}, True, reader) for d in compiled.deps]  # type: ignore[union-attr]
                results = compiled.run(*inputs)  # type: ignore[union-attr]
            else:
                values, _ = self._run_group(i, rerun=True)
        finally:
            torch._C._set_grad_enabled(grad_was)
            if not graphless:
                _pop_saved_hooks()
            self.recompute_cpu_s += time.thread_time() - start
            if rng_after is not None:
                torch.set_rng_state(rng_after)
        if buffers:
            _copy_buffers(buffers, backup)
        if versions is not None:
            _set_versions(touched, versions)
        if graphless:
            # (the detached inputs are the step's values; the constants, its parameters, are not: their
            # gradients go to them directly)
            st.rerun = (results, inputs, [d.name in self.ex._group_of for d in compiled.deps])  # type: ignore[union-attr]
            self._set_in_ram(i, True)
            return
        try:
            if len(recorded) != st.n_packs:
                raise ExecutionError(f"recomputing {self.ex.graph.nodes[i].name} saved {len(recorded)} tensors where its first run saved {st.n_packs}; the node is not deterministic")
            for record in st.owned:  # (_wait and materialized inlined: the encoder's layer owns 21 storages)
                if record.pending is not None:
                    self._wait(record)
                storage, nbytes, where = record.storage, record.nbytes, record.source
                if storage.nbytes() == nbytes:
                    continue  # still held by a view that stayed in RAM
                source = (recorded[where[1]] if where[0] == "pack" else _tensors(values[where[1]])[where[2]]).untyped_storage()
                if source.nbytes() != nbytes:
                    raise ExecutionError(f"recomputing {self.ex.graph.nodes[i].name} gave {source.nbytes()} bytes where its first run gave {nbytes}")
                storage._swap_data_ptr_(source)  # the fresh bytes move in: no copy, no second buffer
        finally:
            recorded.clear()  # (autograd's nodes of the rerun hold its append, and with it this list)
            del values
        self._set_in_ram(i, True)

    # -- autograd's saved tensors ---------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> _Saved | torch.Tensor:
        """Autograd saves ``t``: a parameter, buffer or unmanaged node's output is handed back as it is
        (nothing to check when it is read); a managed node's storage is saved with its record, checked
        when autograd reads it; a new storage is the running node's, to record when it finishes."""
        key = _key(t.untyped_storage())
        position = self.current_packs
        self.current_packs += 1
        record = self.records.get(key)
        if record is None:
            if self._is_constant(key):
                return t
            if self._unmanaged_producer(key) is not None:
                return t.detach()
            if self.current is not None:
                self.pending_own.append((position, t))
            return _Saved(t.detach(), _PendingRecord(self, key))
        return _Saved(t.detach(), record)

    def _pack_unchecked(self, t: torch.Tensor) -> torch.Tensor:
        """:meth:`_pack` once the first step has shown that every read finds its bytes in RAM (no prefetch,
        nothing fetched unplanned: :meth:`ScheduleExecutor._learn`). The same code reads the same storages
        at the same moments every step, so there is nothing left to check when autograd reads one: the
        saved tensor is only collected, and :meth:`_finish` finds the node's storages among them. Still a
        Python call per saved tensor, but no record looked up, made or checked (the encoder's layer saves
        28 tensors). Unchecked learnt steps took 80-180 us less than checked ones (in-process, interleaved:
        the encoder x8 at 98.5%, MobileNetV2 x2 at 70% and 50%)."""
        self.packs.append(t)  # type: ignore[union-attr]
        return t.detach()  # (never ``t``: a node that saves its own output would hold itself, see _recompute)

    def _unpack(self, saved: _Saved | torch.Tensor) -> torch.Tensor:
        if type(saved) is not _Saved:
            return saved  # (see _pack)
        record = saved.record
        if isinstance(record, _PendingRecord):
            record = saved.record = record.resolve()
        if record is not None and self.state:
            self._ensure(record, "autograd")
        return saved.tensor


def _unpack_unchecked(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _copy_buffers(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Put buffers back (``torch._foreach_copy_``) without autograd recording it, as ``torch.no_grad``
    would (a buffer may require grad), by grad mode's own switch: the context manager's Python took a
    few microseconds on the cold cache of a step."""
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        torch._foreach_copy_(destinations, sources)
    finally:
        torch._C._set_grad_enabled(grad_was)


def _never_unpacked(_: None) -> None:
    raise ExecutionError("a recompute's autograd graph was run backward; the executor never does that")


class _PendingRecord:
    """A saved tensor packed while its node was still running: its storage record exists only once the
    node has finished, so the lookup waits until the tensor is unpacked."""

    __slots__ = ("run", "key")

    def __init__(self, run: _Run, key: int):
        self.run = run
        self.key = key

    def resolve(self) -> _Storage | None:
        return self.run.records.get(self.key)


# ---- the functions ---------------------------------------------------------------------------

#: glibc's ``mallopt`` parameters (malloc.h) and what :func:`retain_freed_memory` sets them to
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_RETAINED_MMAP_THRESHOLD = 32 * 2**20  # (glibc's largest: HEAP_MAX_SIZE / 2 on 64-bit)
_RETAINED_TRIM_THRESHOLD = 2**31 - 1  # (an int: mallopt takes a C int)


def retain_freed_memory() -> bool:
    """Make the C allocator keep freed blocks for reuse instead of handing them back to the kernel;
    True where it could (glibc), False elsewhere (nothing changed). Process-wide: for the programs that
    run schedules (the ``execute`` command, the benchmarks), not something the library does by itself.

    Why: glibc serves blocks from 128 KiB up with ``mmap`` and returns them with ``munmap`` when freed (and
    trims its heap's free top), so the next tensor of that size page-faults fresh, zeroed pages in. A
    plain step frees its activations only at the end and settles into reusing the same blocks; a schedule
    that frees a tensor mid-step and recomputes or pages it back in paid those page faults on every step
    (a fresh process running MobileNetV2 x0.35 at 128x128 under greedy remat at half of checkpoint-all's
    memory: a median of 1,400-4,300 minor faults per step over steps 7-24, none with this;
    ``tests/test_execute.py``). How many depends on the process's past, since glibc raises its
    thresholds as large blocks are freed (the benchmark, after profiling, saw 3-13). With this the
    blocks stay in the heap whatever came before: what a device's fixed arena does. The allocator's
    accounting, which is what the executor measures as peak, is not changed; the process's resident size
    stays at its high-water mark."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _RETAINED_MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _RETAINED_TRIM_THRESHOLD))


def memory_allowance_bytes(module: nn.Module, graph: TrainingGraph) -> int:
    """How far an executed step's measured peak (parameter gradients left out) may exceed the simulator's,
    and why: the simulator counts the graph's tensors, the allocator also sees each operation's transient
    workspace. The largest is a convolution's: PyTorch's native CPU convolution, which a step runs on
    (NOTE [kernel choice] in :mod:`poetlab.kernels`), and its backward unfold its
    input into kernel-area copies (im2col), at most ``kernel area x`` the largest tensor of the graph; plus
    one more tensor of that size for autograd summing two gradient contributions (a skip connection)
    before it passes the sum on. So: ``(largest kernel area + 1) x`` the graph's largest node."""
    kernel_area = max(
        (math.prod(m.kernel_size) for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)), default=1
    )
    return (kernel_area + 1) * int(graph.output_bytes.max())



def execute(
    module: nn.Module,
    schedule: Schedule,
    batch: tuple[torch.Tensor | Sequence[torch.Tensor], object],
    *,
    graph: TrainingGraph,
    loss_fn: Callable[..., torch.Tensor],
    costs: CostModel | None = None,
    paging_dir: str | None = None,
    prefetch: bool = False,
    durable: bool = True,
    strict: bool = True,
    measure_memory: bool = True,
) -> ExecutionResult:
    """Run one training step of ``module`` on ``batch = (inputs, targets)`` as ``schedule`` says.

    ``graph`` is the :func:`poetlab.trace` graph the schedule was planned on; gradients are added to the
    parameters' ``.grad`` exactly as ``loss_fn(module(inputs), targets).backward()`` would. With
    ``costs``, the result carries the simulator's prediction for the same schedule.
    """
    executor = ScheduleExecutor(module, graph, schedule, loss_fn, paging_dir=paging_dir, prefetch=prefetch, durable=durable, strict=strict)
    result = executor.step(batch[0], batch[1], measure_memory=measure_memory)
    if costs is not None:
        from dataclasses import replace

        result = replace(result, predicted=simulate(schedule, graph, costs))
    return result

""":class:`ScheduleExecutor`: a schedule bound to a module once, run step after step; it learns from its first step what the later ones need (NOTE [8]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
import time
from collections.abc import Callable, Sequence

import torch
from torch import fx, nn

from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, Schedule
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.kernels import planned_kernels
from poetlab.torch.execute.codegen import compile_group, stands_in, bind_graph
from poetlab.torch.execute.graphless import graphless_nodes, managed_nodes
from poetlab.torch.execute.result import ExecutionError, ExecutionResult
from poetlab.torch.execute.segments import backward_runs_of, handovers_of, segments_of
from poetlab.torch.execute.state import BufferBackup, RerunBuffers, copy_buffers, storage_key, pop_saved_hooks, push_saved_hooks, set_versions
from poetlab.torch.execute.step import StepRun
from poetlab.torch.fx_trace import traced_module
from poetlab.torch.probes import attribute_tensors

if TYPE_CHECKING:
    from poetlab.torch.execute.codegen import CompiledGroup


# ---- the executor ------------------------------------------------------------------------------


class ScheduleExecutor:
    """Runs ``schedule`` on ``module`` step after step (the fx trace and the binding are built once).

    ``loss_fn(output, targets)`` must be the loss the graph was traced with; ``paging_dir`` is where the
    private paging directory is made (the system's temporary directory by default).
    """

    # (slots, for the steps' reads of its attributes: see StepRun's)
    __slots__ = (
        "module", "graph", "schedule", "loss_fn", "paging_dir", "prefetch", "durable", "strict", "gm",
        "binding", "modules", "params", "constants", "_constants_met", "buffers", "draws_rng", "_tensor_valued",
        "placeholders", "_batch_of", "_group_of", "_external", "_compiled", "_n_computes", "_managed",
        "_packed", "_hooked", "_kept", "_learnt", "_unchecked_reads", "_owned_sources", "_owned_places",
        "_tracking", "_computed_at", "_handover", "_handed_frees", "_segments", "_backward_start",
        "_handover_candidates", "_bookkeeping_end", "_output_bytes",
        "_has_pageouts", "_rerun_code", "_buffer_backup", "_buffers_of", "_rerun_in_backward", "_backward_buffers", "_aside",
        "_packed_now", "_events", "_hook_at", "_hookless", "_graphless", "_trigger",
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
        self.gm = traced_module(module, graph.metadata)  # (as poetlab.torch.trace traced it: its leaves, concrete shapes)
        self.binding = bind_graph(graph, self.gm)
        self.modules = dict(self.gm.named_modules())
        self.params = [p for p in module.parameters() if p.requires_grad]
        # (their storages are looked up per step; fx tensor constants, such as ``torch.arange(T)``, are constants too)
        self.constants = [*module.parameters(), *module.buffers(), *attribute_tensors(self.gm)]
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
        # input nodes are one placeholder each: poetlab.torch.trace)
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
            compile_group(self.gm, ms, ext) if i != self.binding.loss else None
            for i, (ms, ext) in enumerate(zip(self.binding.members, self._external, strict=True))
        ]
        self._n_computes: dict[int, int] = {}
        for op in schedule.ops:
            if op.kind is OpKind.COMPUTE:
                self._n_computes[op.node] = self._n_computes.get(op.node, 0) + 1
        # the reruns' code: their BatchNorm modules through RerunBatchNorm (the first runs' where it has none)
        self._rerun_code: list[CompiledGroup | None] = list(self._compiled)
        for i, n in self._n_computes.items():
            members = self.binding.members[i]
            if n > 1 and self._compiled[i] is not None and any(stands_in(self.gm, m) for m in members):
                self._rerun_code[i] = compile_group(self.gm, members, self._external[i], rerun=True)
        self._managed, self._packed, self._hooked, self._kept = managed_nodes(graph, schedule, self.binding)
        # the position of the first backward compute (the schedule's end if there is none)
        self._backward_start = next(
            (p for p, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and self.binding.forward_of[op.node] is not None), len(schedule.ops))
        # the managed nodes whose first run builds no autograd graph (graphless_nodes): from then on they are
        # no storages of the step's (not managed, nothing packed for them); their reruns and backward pre-hooks
        # stay (_hooked, _kept)
        self._graphless = graphless_nodes(self)
        if self._graphless:
            self._managed = self._managed - self._graphless
            self._packed = self._managed | {j for j, node in enumerate(graph.nodes) if j in self._packed and any(k in self._managed for k in node.inputs)}
        self._trigger = torch.zeros((), requires_grad=True)  # (GraphlessRun's)
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
        # they run without the saved-tensor hooks (StepRun._finish_hookless)
        self._hookless: dict[int, tuple[tuple[tuple[str, str | None], ...], int]] = {}
        # whether unmanaged nodes' storages are made known by key (StepRun._track_values): until a step has
        # shown that every packed node finds its storages by position, which then look none up (_learn)
        self._tracking = True
        if any(n > 1 for n in self._n_computes.values()) and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
            # (a private API of the pinned torch: it moves a rerun's fresh bytes into the emptied storage)
            raise ExecutionError(f"torch {torch.__version__} cannot move recomputed bytes in place (no UntypedStorage._swap_data_ptr_); install the pinned torch (pyproject.toml)")
        if push_saved_hooks is None or pop_saved_hooks is None or not hasattr(torch._C, "_set_grad_enabled"):
            raise ExecutionError(f"torch {torch.__version__} lacks the saved-tensor hook calls the executor uses; install the pinned torch (pyproject.toml)")
        # where each node is first computed
        self._computed_at = {op.node: p for p, op in reversed(list(enumerate(schedule.ops))) if op.kind is OpKind.COMPUTE}
        # the nodes handed over to autograd after the step's last use of them, by that use's position, and
        # the positions of their last frees (handovers_of): none until a step has shown which (_learn)
        self._handover: dict[int, tuple[int, ...]] = {}
        self._handed_frees: frozenset[int] = frozenset()
        self._segments = segments_of(self)
        self._handover_candidates = handovers_of(self)  # (those of them nobody else holds are handed over: _learn)
        self._events, self._bookkeeping_end = backward_runs_of(self)
        self._output_bytes = [node.output_bytes for node in graph.nodes]
        self._has_pageouts = any(op.kind is OpKind.PAGE_OUT for op in schedule.ops)
        self._buffer_backup: BufferBackup | None = None
        self._buffers_of: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        # the forward nodes the schedule reruns in the backward pass (after the first gradient's compute)
        self._rerun_in_backward = frozenset(
            op.node for op in schedule.ops[self._backward_start:]
            if op.kind is OpKind.COMPUTE and self.binding.forward_of[op.node] is None and op.node not in self.binding.inputs
        )
        self._backward_buffers: RerunBuffers | None = None

    def _without_hooks(self, run: "StepRun") -> dict[int, tuple[tuple[tuple[str, str | None], ...], int]]:
        """The lean managed nodes that the first step found all of whose storages without the saved-tensor
        hooks (``run.hookless``: :meth:`StepRun._hookless_places`), for :attr:`_hookless`.

        Without the hooks, autograd checks each saved tensor's version counter when it reads it back: a
        rerun buffer (:class:`RerunBuffers`: a SyncBatchNorm's running statistics), which the step writes
        a second time (its reset before the backward pass and the rerun's update, or a forward rerun's
        update and put-back), would fail that check. Each such write leaves the very bytes the buffer was
        saved with by the time the node's backward reads it (:class:`RerunBuffers`' reset), so the step
        sets those buffers' versions back after it (``set_versions``, a private call of the pinned torch).
        Where buffers are kept and put back after the backward pass instead (a module shared by several
        nodes, a node rerun twice), they do not hold those bytes in
        between: a node that saved one of them keeps the hooks (which autograd does not version-check)."""
        found = {i: places for i, places in run.hookless.items() if places is not None and i in self._owned_sources}
        if not found or set_versions is None:
            return {}
        rerun = self._rerun_buffers()
        if rerun.buffers and rerun.before_step is None:
            rewritten = {id(b) for b in rerun.buffers}
            found = {i: places for i, places in found.items() if not any(id(b) in rewritten for b in self._node_buffers(i))}
        return found

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
        write none of theirs: :class:`RerunBatchNorm`)."""
        code = self._rerun_code[i]
        stand_ins = code.stand_ins if code is not None else frozenset()
        modules = [self.modules[m.target] for m in self.binding.members[i] if m.op == "call_module" and m.target not in stand_ins]
        return [b for mod in modules for b in mod.buffers() if b.numel()]

    def _rerun_buffers(self) -> RerunBuffers:
        """The buffers of the nodes rerun in the backward pass (each once, in case modules are shared), and
        how a step gives them back the values its forward pass left (:class:`RerunBuffers`), found once."""
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
            self._backward_buffers = RerunBuffers(
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

    def _learn(self, run: "StepRun") -> None:
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
          record to check each read against (:meth:`StepRun._pack_unchecked`), and a managed node that owned
          only storages of its own (no view of another node's) finds them where the first step did: the
          same values and saved tensors, by position (``run.owned_sources``), without sorting out which
          of the others are constants, other nodes' or duplicates. When every packed node is such a node,
          no storage of an unmanaged node is looked up by key any more, so none is made known
          (``_tracking``), and the segments' code collects the autograd nodes to hook itself.
          Then, too, the managed and kept nodes that no other node holds (``run.shared``, ``run.viewing``)
          are handed over to autograd after the step's last use of them (:func:`handovers_of`): their last
          frees become bookkeeping, and a pre-hook that had only such frees to do goes (each rerun's free
          and its inputs' frees).
        - Only the parameters and buffers that those nodes met (saved, or returned as values) need their
          storages looked up (:attr:`StepRun.constant_keys`): the same code reads the same tensors every step.
          Their storages are still looked up on every step, since ``p.data = ...`` replaces one.

        Every pre-hook and every saved tensor under the hooks is a Python call (a few microseconds each on
        a busy cache): this is what the executor's own time follows once it has learnt."""
        self._learnt = True
        met = run.constants_met
        self._constants_met = [t for t in self.constants if storage_key(t.untyped_storage()) in met]
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
                self._events, self._bookkeeping_end = backward_runs_of(self)
        hook_at = frozenset(j for j, positions in run.worked.items() if not self._handed_frees.issuperset(positions))
        self._hook_at, self._packed_now = hook_at, packed
        # (their code registers pre-hooks, switches the saved-tensor hooks and tracks storages as this showed)
        self._segments = segments_of(self)

    # -- one step ---------------------------------------------------------------------------------
    def step(self, inputs: torch.Tensor | Sequence[torch.Tensor], targets: object, *, measure_memory: bool = False) -> ExecutionResult:
        """Run one training step; gradients are added to ``.grad`` as ``loss.backward()`` would.

        Its times are the whole call's (the step's set-up and clean-up too: the buffers' backup, the
        paging directory made and removed, the gradients put back), as a plain step timed from outside."""
        cpu_start, start = time.thread_time(), time.perf_counter()
        run = StepRun(self, (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs), targets)
        # BatchNorm's running statistics change during the forward pass: kept to put back on failure
        # (:class:`BufferBackup`)
        if self._buffer_backup is None or not self._buffer_backup.take():
            self._buffer_backup = BufferBackup(self.buffers)
            self._backward_buffers = None  # (its reset reads the backup's copies: found again)
            self._buffer_backup.take()
        buffers = self._buffer_backup.copies
        peak = total_peak = None
        try:
            # autograd accumulates into .grad; the caller's gradients wait aside until the step succeeds.
            # Taken first, not before the backward pass: the optimizer's step or ``zero_grad`` has just read
            # every parameter, whose ``.grad`` is then found on a warm cache (after the forward pass, it is
            # found on a cold one)
            self._set_aside_grads()
            with planned_kernels():  # (NOTE [kernel choice] in poetlab.torch.kernels)
                if measure_memory:
                    with measure_allocations() as allocation:
                        run.go()
                    # (this step's gradients, not yet added to those set aside: _restore_grads)
                    grads = [p.grad for p in self.params]
                    total_peak = allocation.peak_bytes
                    peak = allocation.peak_excluding(g.data_ptr() for g in grads if g is not None)
                else:
                    run.go()
        except BaseException:
            if buffers:
                copy_buffers(self.buffers, buffers)
            self._restore_grads(add=False)
            raise
        finally:
            run.close()
        self._restore_grads(add=True)
        if not self._learnt:
            self._learn(run)
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

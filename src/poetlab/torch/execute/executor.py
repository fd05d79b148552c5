""":class:`ScheduleExecutor`: a schedule bound to a module once, run step after step; it learns from its first step what the later ones need (NOTE [8]). See docs/executor.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn

from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, Schedule
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.kernels import planned_kernels
from poetlab.torch.execute.layout import first_plan, node_buffers, step_layout
from poetlab.torch.execute.result import ExecutionError, ExecutionResult
from poetlab.torch.execute.segments import backward_runs_of, segments_of
from poetlab.torch.execute.state import BufferBackup, RerunBuffers, copy_buffers, storage_key, pop_saved_hooks, push_saved_hooks, set_versions
from poetlab.torch.execute.step import StepRun
from poetlab.torch.probes import attribute_tensors


# ---- the executor ------------------------------------------------------------------------------


class ScheduleExecutor:
    """Runs ``schedule`` on ``module`` step after step (the fx trace and the binding are built once).

    ``loss_fn(output, targets)`` must be the loss the graph was traced with; ``paging_dir`` is where the
    private paging directory is made (the system's temporary directory by default).
    """

    # (slots, for the steps' reads of its attributes: see StepRun's)
    __slots__ = (
        "module", "graph", "schedule", "loss_fn", "paging_dir", "prefetch", "durable", "strict", "fast", "layout",
        "plan", "gm", "binding", "modules", "params", "constants", "buffers", "draws_rng", "trigger",
        "_buffer_backup", "_buffers_of", "_backward_buffers", "_aside",
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
        fast: bool = True,
    ):
        """``fast=False`` runs every step as the reference step: each operation through the reference loop
        (no generated segments), every hook on and every read checked, nothing learnt (NOTE [8]). It is
        the specification the default steps are tested against (equal gradients, the same peak)."""
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
        self.fast = fast
        if push_saved_hooks is None or pop_saved_hooks is None or not hasattr(torch._C, "_set_grad_enabled"):
            raise ExecutionError(f"torch {torch.__version__} lacks the saved-tensor hook calls the executor uses; install the pinned torch (pyproject.toml)")
        self.layout = step_layout(module, graph, schedule)
        if any(n > 1 for n in self.layout.n_computes.values()) and not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
            # (a private API of the pinned torch: it moves a rerun's fresh bytes into the emptied storage)
            raise ExecutionError(f"torch {torch.__version__} cannot move recomputed bytes in place (no UntypedStorage._swap_data_ptr_); install the pinned torch (pyproject.toml)")
        self.plan = first_plan(self.layout, fast)
        self.gm, self.binding, self.modules = self.layout.gm, self.layout.binding, self.layout.modules
        self.params = [p for p in module.parameters() if p.requires_grad]
        # (their storages are looked up per step; fx tensor constants, such as ``torch.arange(T)``, are constants too)
        self.constants = [*module.parameters(), *module.buffers(), *attribute_tensors(self.gm)]
        self.buffers = [b for b in module.buffers() if b.numel()]
        # whether each forward node draws random numbers (dropout), learnt on the first step: a node that
        # does has the RNG state before it kept, to replay on a recompute
        self.draws_rng: dict[int, bool] = {}
        self.trigger = torch.zeros((), requires_grad=True)  # (GraphlessRun's)
        self._buffer_backup: BufferBackup | None = None
        self._buffers_of: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._backward_buffers: RerunBuffers | None = None

    def _without_hooks(self, run: "StepRun", owned_sources: dict[int, tuple[tuple, ...]]) -> dict[int, tuple[tuple[tuple[str, str | None], ...], int]]:
        """The lean managed nodes that the first step found all of whose storages without the saved-tensor
        hooks (``run.hookless``: :meth:`StepRun._hookless_places`), for :attr:`StepPlan.hookless`.

        Without the hooks, autograd checks each saved tensor's version counter when it reads it back: a
        rerun buffer (:class:`RerunBuffers`: a SyncBatchNorm's running statistics), which the step writes
        a second time (its reset before the backward pass and the rerun's update, or a forward rerun's
        update and put-back), would fail that check. Each such write leaves the very bytes the buffer was
        saved with by the time the node's backward reads it (:class:`RerunBuffers`' reset), so the step
        sets those buffers' versions back after it (``set_versions``, a private call of the pinned torch).
        Where buffers are kept and put back after the backward pass instead (a module shared by several
        nodes, a node rerun twice), they do not hold those bytes in
        between: a node that saved one of them keeps the hooks (which autograd does not version-check)."""
        found = {i: places for i, places in run.hookless.items() if places is not None and i in owned_sources}
        if not found or set_versions is None:
            return {}
        rerun = self.rerun_buffers()
        if rerun.buffers and rerun.before_step is None:
            rewritten = {id(b) for b in rerun.buffers}
            found = {i: places for i, places in found.items() if not any(id(b) in rewritten for b in node_buffers(self.layout, i))}
        return found

    def group_buffers(self, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Forward node ``i``'s rerun's buffers (:func:`node_buffers`, which a rerun would update a second
        time) and as many tensors to keep them in while it reruns, allocated once."""
        found = self._buffers_of.get(i)
        if found is None:
            buffers = node_buffers(self.layout, i)
            found = self._buffers_of[i] = (buffers, [torch.empty_like(b) for b in buffers])
        return found

    def rerun_buffers(self) -> RerunBuffers:
        """The buffers of the nodes rerun in the backward pass (each once, in case modules are shared), and
        how a step gives them back the values its forward pass left (:class:`RerunBuffers`), found once."""
        if self._backward_buffers is None:
            layout = self.layout
            found = {id(b): b for i in sorted(layout.rerun_in_backward) for b in node_buffers(layout, i)}
            buffers = list(found.values())
            # reset to the step's backup, if every one is its node's alone and the node reruns once there
            owners: dict[int, int] = {}
            for k, members in enumerate(self.binding.members):
                if members and self.binding.forward_of[k] is None:
                    for b in node_buffers(layout, k):
                        owners[id(b)] = owners.get(id(b), 0) + 1
            reruns = [op.node for op in self.schedule.ops[layout.backward_start:] if op.kind is OpKind.COMPUTE]
            backup = {id(b): self._buffer_backup.copies[k] for k, b in enumerate(self.buffers)} if self._buffer_backup else {}
            alone = all(owners.get(key) == 1 and key in backup for key in found) and all(reruns.count(i) == 1 for i in layout.rerun_in_backward)
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
        if not self.fast:
            return  # (the reference step: every step as the first)
        layout, plan = self.layout, self.plan
        met = run.constants_met
        learnt = replace(
            plan, learnt=True, tensor_valued=dict(run.tensor_valued),
            constants_met=tuple(t for t in self.constants if storage_key(t.untyped_storage()) in met),
        )
        if not self.prefetch and run.n_unplanned == 0:
            owned_sources = {i: sources for i, sources in run.owned_sources.items() if sources is not None}
            packed = layout.managed | frozenset(run.viewing)
            learnt = replace(
                learnt,
                packed=packed,
                unchecked_reads=True,
                owned_sources=owned_sources,
                tracking=not packed <= owned_sources.keys(),
                owned_places={
                    i: tuple((True, s[1], 0) if s[0] == "pack" else (False, layout.external[i].index(s[1]), s[2]) for s in sources)
                    for i, sources in owned_sources.items()
                },
                hookless=self._without_hooks(run, owned_sources),
            )
            handed = {
                k: use_and_free for k, use_and_free in layout.handover_candidates.items()
                if k not in run.shared and k not in run.viewing and (k in layout.kept or k in owned_sources)
            }
            if handed:
                after: dict[int, tuple[int, ...]] = {}
                for k, (use, _) in sorted(handed.items()):
                    after[use] = (*after.get(use, ()), k)
                handed_frees = frozenset(free for _, free in handed.values())
                events, ends = backward_runs_of(layout, handed_frees)
                learnt = replace(learnt, handover=after, handed_frees=handed_frees, events=events, bookkeeping_end=ends)
        learnt = replace(learnt, hook_at=frozenset(j for j, positions in run.worked.items() if not learnt.handed_frees.issuperset(positions)))
        # (their code registers pre-hooks, switches the saved-tensor hooks and tracks storages as this showed)
        self.plan = replace(learnt, segments=segments_of(layout, learnt))

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
        if not self.plan.learnt:
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

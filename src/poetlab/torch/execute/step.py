"""One executed step (:class:`StepRun`): the reference that advances the schedule operation by operation, one method per operation kind (free, page out, page in, recompute, compress; NOTE [2]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
import math
import weakref
from collections.abc import Sequence

import torch

from poetlab.core.schedule import Op, OpKind
from poetlab.techniques.bittrain import as_words, compress, decompress
from poetlab.torch.paging import PageStore
from poetlab.torch.probes import tensors_in
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.execute.segments import COMPUTE, RECOMPUTED_BATCH, SKIPPED_FREE
from poetlab.torch.execute.state import COMPRESSION_OPS, NodeState, copy_buffers, storage_key, set_versions, storages_of
from poetlab.torch.execute.step_compute import StepComputing
from poetlab.torch.execute.step_records import StepRecords

if TYPE_CHECKING:
    from poetlab.torch.execute.executor import ScheduleExecutor
    from poetlab.torch.execute.segments import Segment
    from poetlab.torch.execute.state import StorageRecord


class StepRun(StepComputing, StepRecords):
    """The state of one executed step."""

    # (slots, not an instance dict, as ScheduleExecutor has them: a step reads and writes its run's and its
    # executor's attributes throughout, on the cold caches its tensors leave: docs/benchmarks.md)
    __slots__ = (
        "ex", "layout", "plan", "tensor_valued", "inputs", "targets", "state", "values", "constants", "records", "_constant_keys", "constants_met",
        "batch_keys", "store", "unmanaged_keys", "cursor", "current", "current_packs", "pending_own", "packs",
        "rng_before", "hooks", "seen_fns", "pending_hooks", "worked", "shared", "viewing", "owned_sources",
        "hookless", "loss", "loss_value", "planned", "planned_peak", "n_computes", "n_unplanned", "n_compresses",
        "recompute_cpu_s", "buffers_kept", "n_recomputes", "n_pageouts", "n_pageins", "n_skipped",
        "n_decompresses", "compressed_bytes",
    )

    def __init__(self, ex: ScheduleExecutor, inputs: tuple[torch.Tensor, ...], targets: object):
        self.ex = ex
        # what the schedule asks of each node, and what this step does beyond the reference loop (NOTE [8])
        self.layout, self.plan = ex.layout, ex.plan
        self.inputs = inputs
        self.targets = targets
        self.state = [NodeState() for _ in range(ex.graph.n_nodes)]
        self.values: dict[str, object] = {}
        self.constants: dict[str, object] = {}
        self.records: dict[int, StorageRecord] = {}  # storage key -> record
        self._constant_keys: set[int] | None = None  # (built on first need: see constant_keys)
        self.constants_met: set[int] = set()  # keys of the constants met, while the executor learns
        self.batch_keys: set[int] = set()
        self.store: PageStore | None = None
        if ex.layout.has_pageouts:
            self.store = PageStore(ex.paging_dir, prefetch=ex.prefetch, durable=ex.durable)
        # storage key -> the unmanaged node whose output it is, and a weak reference to the storage (track_values)
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
        # pre-hook registered after another is cheaper than one between the forward pass's operations
        # (_hook_pending)
        self.pending_hooks: list[tuple[int, tuple[object, ...]]] = []
        # backward nodes whose pre-hook had work to do, and the positions of the operations that had it
        # (what the executor learns from: StepPlan)
        self.worked: dict[int, list[int]] = {}
        self.shared: set[int] = set()  # managed or kept nodes whose storages other nodes hold too (handovers_of)
        self.viewing: set[int] = set()  # unmanaged nodes whose values are views of managed memory
        # the sources (StorageRecord.source) of the storages each managed node owned, None where it also held
        # another node's (ScheduleExecutor._learn)
        self.owned_sources: dict[int, tuple[tuple, ...] | None] = {}
        # where each of those nodes' storages are found without the saved-tensor hooks, None where some are
        # not (StepPlan.hookless)
        self.hookless: dict[int, tuple[tuple[tuple[str, str | None], ...], int] | None] = {}
        # whether each hooked forward node's values are tensors (StepPlan.tensor_valued)
        self.tensor_valued: dict[int, bool] = {}
        self.loss: torch.Tensor | None = None
        self.loss_value = math.nan
        self.planned = 0
        self.planned_peak = 0
        self.n_computes = self.n_recomputes = self.n_pageouts = self.n_pageins = 0
        self.n_unplanned = self.n_skipped = 0
        self.n_compresses = self.n_decompresses = self.compressed_bytes = 0
        self.recompute_cpu_s = 0.0
        self.buffers_kept = False  # (the buffers of the nodes rerun in the backward pass: _rerun_buffers)

    @property
    def constant_keys(self) -> set[int]:
        """Keys of the storages no schedule frees or pages: parameters, buffers, targets, the batch. Built
        on first need, since a step that manages no node (checkpoint-all) never asks; once the executor
        has learnt which parameters and buffers its managed nodes meet, of those only (the lookups
        of all of them cost a measurable share of a small step)."""
        if self._constant_keys is None:
            met = self.plan.constants_met
            constants = self.ex.constants if met is None else met
            self._constant_keys = {storage_key(t.untyped_storage()) for t in [*constants, *tensors_in(self.targets)]}
            self._constant_keys |= self.batch_keys
        return self._constant_keys

    def _is_constant(self, key: int) -> bool:
        if key not in self.constant_keys:
            return False
        if not self.plan.learnt:
            self.constants_met.add(key)
        return True

    def close(self) -> None:
        self._end_hooks()  # (a step that failed while a packed node ran in a segment)
        if self.state:  # (graphless nodes' autograd functions hold their states, which may hold their outputs)
            for i in self.layout.graphless:
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
        forward_of = self.layout.binding.forward_of
        segments = self.plan.segments
        # (the forward pass builds autograd's graph whatever the caller's mode: switched on once, by
        # torch.enable_grad's own call, without the context manager's Python)
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
        holding = {self.layout.group_of[name] for name in self.values} | {i for i, _ in self.unmanaged_keys.values()}
        for i in holding - self.layout.managed - self.layout.kept - self.layout.binding.inputs:
            self._drop_values(i)
        rerun = self.ex.rerun_buffers()  # (on a failure, the step puts every buffer back as it was before it)
        reset = rerun.before_step is not None and self.plan.unchecked_reads
        if rerun.buffers:
            if reset:
                versions = [b._version for b in rerun.buffers] if self.plan.hookless else None
                copy_buffers(rerun.buffers, rerun.before_step)  # type: ignore[arg-type]
                if versions is not None:
                    set_versions(rerun.buffers, versions)  # (ScheduleExecutor._without_hooks)
            else:
                torch._foreach_copy_(rerun.kept, rerun.buffers)
            self.buffers_kept = True
        self.loss.backward()
        self.loss = None
        self._advance(len(self.ex.schedule.ops))
        if rerun.buffers and not reset:
            copy_buffers(rerun.buffers, rerun.kept)
        if self.ex.prefetch:
            for record in self.records.values():
                self._wait(record)

    def _advance_to_backward(self, j: int) -> None:
        """Autograd is about to run a node of backward node ``j``: perform the schedule up to and
        including ``j``'s compute (nothing if it is done already)."""
        if self.state[j].computed:
            return
        position = self.layout.computed_at.get(j, -1)
        if position < self.cursor:
            raise ExecutionError(f"autograd ran {self.ex.graph.nodes[j].name} but the schedule never computes it; plan on the traced graph")
        worked = self._advance(position + 1)
        if worked and not self.plan.learnt:
            self.worked[j] = worked

    def _advance(self, stop: int) -> list[int]:
        """Perform the schedule's operations up to position ``stop`` (exclusive): runs of bookkeeping at
        once (:func:`backward_runs_of`), the others one by one, each followed by the hand-overs due after it
        (:func:`handovers_of`). The positions of those that had work to do (more than counting: an operation of
        :meth:`_do`, or the frees of a run of bookkeeping that freed a storage)."""
        ops, events, ends, handover = self.ex.schedule.ops, self.plan.events, self.plan.bookkeeping_end, self.plan.handover
        worked: list[int] = []
        while self.cursor < stop:
            end = min(ends[self.cursor], stop)
            if end > self.cursor:
                if self.replay(events[self.cursor:end]):
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
        """A compute of forward node ``i`` that was computed before (:meth:`_do`)."""
        self.n_computes += 1
        self.n_recomputes += 1
        self._recompute(i)

    def _do(self, op: Op) -> None:
        i = op.node
        st = self.state[i]
        if op.kind in COMPRESSION_OPS:
            self._compression_op(op)
            return
        if op.kind is OpKind.COMPUTE:
            if self.layout.binding.forward_of[i] is None and st.computed:
                self._rerun(i)
                return
            self.n_computes += 1
            if self.layout.binding.forward_of[i] is not None:  # autograd computes it; we only follow
                self.n_skipped += int(st.computed)  # a gradient cannot be recomputed outside autograd
                self._set_in_ram(i, True)
                st.computed = True
            else:
                self._first_compute(i)
            return
        if self.layout.binding.forward_of[i] is not None or i in self.layout.binding.inputs:
            # Gradients live in autograd's engine, which frees each after its last use as the schedule
            # does; paging one is not possible, nor freeing the caller's batch: those are counted.
            self.n_skipped += int(op.kind is not OpKind.FREE or i in self.layout.binding.inputs)
            if op.kind is not OpKind.PAGE_OUT:
                self._set_in_ram(i, op.kind is OpKind.PAGE_IN)
            return
        if op.kind is OpKind.FREE:
            self.free(i)
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

    def _run_segment(self, segment: Segment) -> None:
        """Run a :class:`Segment`'s code, then the bookkeeping after its last call."""
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
            self.track(i, [values[name] for name in names])
        self.replay(segment.events)

    def free(self, i: int) -> None:
        """The schedule frees forward node ``i`` (not the batch), as :meth:`_do` does."""
        self._set_in_ram(i, False)
        if i not in self.layout.managed:
            self._drop_values(i)
            for v in self.layout.views_freed_with.get(i, ()):  # (their values hold its storage)
                self._drop_values(v)
            self.state[i].first_values = None  # (a graphless node's: graphless_in_segment)

    def do_at(self, position: int) -> None:
        self._do(self.ex.schedule.ops[position])

    def track(self, i: int, external: Sequence[object]) -> None:
        self.track_values(i, storages_of(external))

    def replay(self, events: Sequence[tuple[int, int]]) -> bool:
        """What :meth:`_do` does for computes done elsewhere and frees that need no work (the events
        of :func:`_bookkeeping`), in one loop: the count of the planned bytes and of the storages' holders.
        Whether a node holding storages was among them (a storage may have been freed)."""
        nbytes, state = self.layout.output_bytes, self.state
        planned, peak = self.planned, self.planned_peak
        held = False
        for i, what in events:  # (_set_in_ram, inlined)
            st = state[i]
            compute = what == COMPUTE or what == RECOMPUTED_BATCH
            if compute:
                self.n_computes += 1
                self.n_recomputes += what == RECOMPUTED_BATCH
                st.computed = True
            elif what == SKIPPED_FREE:
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

    def _compression_op(self, op: Op) -> None:
        """Compress node ``op.node``'s storages beside the dense ones, decompress them back into the
        emptied storages, or drop the compressed copies. Gradients and the caller's batch are not
        compressed (counted as skipped; a decompress of one only marks it in RAM, as a page-in does)."""
        i = op.node
        st = self.state[i]
        name = self.ex.graph.nodes[i].name
        if self.layout.binding.forward_of[i] is not None or i in self.layout.binding.inputs:
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
    def _wait(record: StorageRecord) -> None:
        if record.pending is not None:
            future, record.pending = record.pending, None
            future.result()

    def _ensure(self, record: StorageRecord, reader: str) -> None:
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

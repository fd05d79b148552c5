"""A step's storage records and autograd's saved tensors: pack and unpack hooks, the backward pre-hooks (NOTE [1], [4], [7], [8]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
import weakref
from collections.abc import Callable, Sequence

import torch

from poetlab.torch.probes import tensors_in
from poetlab.torch.execute.result import ExecutionError
from poetlab.torch.execute.state import PUSHED, PendingRecord, Saved, StorageRecord, storage_key, pop_saved_hooks, push_saved_hooks, storages_of, unpack_unchecked

if TYPE_CHECKING:
    from poetlab.torch.execute.state import NodeState


class StepRecords:
    """The step's storage records and autograd's saved tensors (NOTE [1], [4], [7], [8]); a mixin of :class:`StepRun`."""

    __slots__ = ()

    def track_values(self, i: int, storages: Sequence[torch.UntypedStorage]) -> None:
        """Unmanaged node ``i``'s values live in ``storages``: a managed node that saves or views them finds
        their producer (:meth:`_unmanaged_producer`; :meth:`_drop_values` forgets them).

        Each is known by its key with a weak reference to it (torch keeps a storage's Python object as long
        as the storage lives): a segment's code drops a value at its last use, which may come before the
        schedule's free of it, and a storage made after the value's died may have its key (the address of
        a freed StorageImpl is the next one's, often). Taken for the dead node's, a packed node's own
        output would be held by it, and emptied at its free."""
        keys = [storage_key(storage) for storage in storages]
        self.state[i].unmanaged_keys = tuple(keys)
        for key, storage in zip(keys, storages, strict=True):
            self.unmanaged_keys[key] = (i, weakref.ref(storage))

    def _unmanaged_producer(self, key: int) -> int | None:
        """The unmanaged node whose value lives in the storage of ``key`` (:meth:`track_values`), if any:
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
        for name in self.layout.external[i]:
            self.values.pop(name, None)
        # (the keys go too: once its memory is freed, a new storage may come to have the same key)
        for key in self.state[i].unmanaged_keys:
            entry = self.unmanaged_keys.get(key)
            if entry is not None and entry[0] == i:
                del self.unmanaged_keys[key]
        self.state[i].unmanaged_keys = ()

    def _hand_over(self, i: int) -> None:
        """The step has no more use for node ``i`` (:func:`handovers_of`): drop its values and the records of
        its storages, leaving them to autograd, which lets go of them after the last backward node that
        reads them. Its free is then counted only; it stays in RAM for the planned bytes until then."""
        st = self.state[i]
        if self.plan.tracking:  # (else none was entered: finish_owned)
            for record in st.owned:
                del self.records[storage_key(record.storage)]
        st.owned = st.held = st.paged = ()
        self._drop_values(i)

    def _set_in_ram(self, i: int, in_ram: bool) -> None:
        """Node ``i`` enters or leaves RAM: count its storages' users, free those nobody holds."""
        st = self.state[i]
        if st.in_ram == in_ram:
            return
        st.in_ram = in_ram
        self.planned += (1 if in_ram else -1) * self.layout.output_bytes[i]
        self.planned_peak = max(self.planned_peak, self.planned)
        self._count_holders(st, in_ram)

    def _count_holders(self, st: NodeState, in_ram: bool) -> None:
        """A node holding storages entered or left RAM: free the storages nobody holds any more.

        Once nothing is tracked (``StepPlan.tracking``), every storage with a record is its
        owner's alone (a node that holds another's keeps the tracking on: :meth:`ScheduleExecutor._learn`),
        so none is counted: each goes when its owner leaves RAM. (A count would be paid per storage three
        times a step: in at its compute and its rerun, out at its free.)"""
        tracking = self.plan.tracking
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

    def begin(self, i: int, packed: bool) -> None:
        """Forward node ``i`` is about to run for the first time: keep the RNG state before it (while it
        is not known whether the node draws random numbers) and, for a packed node, switch autograd's
        saved-tensor hooks on (:meth:`finish` switches them off)."""
        self.rng_before = torch.get_rng_state() if self.ex.draws_rng.get(i) is not False else None
        self.current, self.current_packs, self.pending_own = i, 0, []
        if packed:
            if self.plan.unchecked_reads:
                self.packs = []
                self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_unchecked, unpack_unchecked)
            else:
                self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self.hooks.__enter__()

    def begin_owned(self, i: int) -> None:
        """:meth:`begin` for a managed node that finds its storages where the first step did, nothing
        tracked (:meth:`finish_owned`): the RNG state only where the node draws random numbers, and the
        saved-tensor hooks pushed directly (:data:`push_saved_hooks`)."""
        self.rng_before = torch.get_rng_state() if self.ex.draws_rng[i] else None
        self.current, self.packs = i, []
        push_saved_hooks(self._pack_unchecked, unpack_unchecked)
        self.hooks = PUSHED

    def finish_owned(self, i: int, external: list[object]) -> None:
        """:meth:`finish_in_segment` for such a node (:meth:`begin_owned`). Its storages are taken
        from their places among its saved tensors and values (``StepPlan.owned_places``), and
        not entered in :attr:`records` by key: once nothing is tracked, nothing looks one up (the
        checked reads and the sorting out of other nodes' storages do; :meth:`ScheduleExecutor._learn`).
        That and the general path's dispatch were a third of :meth:`finish`'s time. The hooks it pushed are popped and it
        enters RAM here, without :meth:`_end_hooks` and :meth:`_set_in_ram` (nothing to count: not
        tracking, :meth:`_count_holders`); the segment's code collects its autograd nodes to hook."""
        pop_saved_hooks()  # type: ignore[misc]
        self.hooks = self.current = None
        packs, self.packs = self.packs, None
        st = self.state[i]
        st.n_packs = len(packs)  # type: ignore[arg-type]
        st.rng_state, self.rng_before = self.rng_before, None
        self.n_computes += 1
        st.owned = st.held = self._learnt_storages(i, packs, external)  # type: ignore[arg-type]
        st.computed = st.in_ram = True
        self.planned += self.layout.output_bytes[i]
        if self.planned > self.planned_peak:
            self.planned_peak = self.planned

    def finish_hookless(self, i: int, found: tuple[torch.Tensor, ...]) -> None:
        """:meth:`finish_owned` for a managed node that ran without the saved-tensor hooks
        (``StepPlan.hookless``): ``found`` has the tensors whose storages it owns, in the order of
        ``StepPlan.owned_sources``, taken by the segment's code from its fx values and from what
        their autograd nodes saved (``grad_fn._saved_*``). Autograd keeps its saved tensors as they are:
        freeing one empties the storage it shares with them, and a rerun's bytes are swapped into it.
        Pushing the hooks costs a Python call per saved tensor as autograd saves it and another as it reads
        it back (a Conv+BatchNorm+ReLU6 group saves 9); the group's code reads the 2 statistics BatchNorm
        saved from its autograd node instead (the rest are its fx values). Reading them there costs the group
        less than half of what the hooks do (docs/benchmarks.md)."""
        st = self.state[i]
        st.n_packs = self.plan.hookless[i][1]
        self.n_computes += 1
        st.owned = st.held = tuple(
            StorageRecord(storage, storage.nbytes(), i, source)
            for storage, source in zip([t.untyped_storage() for t in found], self.plan.owned_sources[i], strict=True)
        )
        st.computed = st.in_ram = True
        self.planned += self.layout.output_bytes[i]
        if self.planned > self.planned_peak:
            self.planned_peak = self.planned

    def _learnt_storages(self, i: int, packs: list[torch.Tensor], external: list[object]) -> tuple[StorageRecord, ...]:
        """Records of the storages managed node ``i`` owns, taken where the first step found them
        (``StepPlan.owned_places``): among the tensors it saved (``packs``) and its external
        values (``external``, in the order of ``StepLayout.external``)."""
        owned = []
        for (from_pack, index, k), source in zip(self.plan.owned_places[i], self.plan.owned_sources[i], strict=True):
            t = packs[index] if from_pack else external[index]
            if not isinstance(t, torch.Tensor):
                t = tensors_in(t)[k]
            storage = t.untyped_storage()  # type: ignore[union-attr]
            owned.append(StorageRecord(storage, storage.nbytes(), i, source))
        return tuple(owned)

    def _end_hooks(self) -> None:
        hooks, self.hooks, self.current = self.hooks, None, None
        if hooks is PUSHED:
            pop_saved_hooks()
        elif hooks is not None:
            hooks.__exit__(None, None, None)

    def finish_in_segment(self, i: int, external: Sequence[object], members: tuple[object, ...] | None = None) -> None:
        self.n_computes += 1
        self.finish(i, dict(zip(self.layout.external[i], external, strict=True)), list(external), in_segment=True)
        if members is not None and self.owned_sources.get(i) is not None:
            self.hookless[i] = self._hookless_places(i, members)

    def finish(self, i: int, values: dict[str, object], hooked: object, in_segment: bool = False) -> None:
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
        self.rng_before = None  # (not held past its node: the RNG states a step holds are rng_reserve_bytes')
        managed = i in self.layout.managed
        sources = self.plan.owned_sources.get(i) if packs is not None else None
        tracking = self.plan.tracking
        storages = storages_of(values.values()) if tracking and not managed else []
        if sources is not None:
            st.owned = st.held = self._learnt_storages(i, packs, list(values.values()))  # type: ignore[arg-type]
            if tracking:  # (else nothing looks them up: finish_owned)
                self.records.update((storage_key(record.storage), record) for record in st.owned)
        elif not managed and (not tracking or not any(storage_key(storage) in self.records for storage in storages)):
            # unmanaged, and no view of a managed node's memory (learnt, when not tracking: nodes that view
            # one are packed, _learn): autograd and reference counting free it
            if tracking:
                self.track_values(i, storages)
        else:
            if not managed:
                self.viewing.add(i)
            candidates = [(t, ("value", name, k)) for name, value in values.items() for k, t in enumerate(tensors_in(value))]
            candidates += [(t, ("pack", position)) for position, t in (pending if packs is None else enumerate(packs))]
            held: dict[int, StorageRecord] = {}
            own_only = managed
            for t, source in candidates:
                storage = t.untyped_storage()
                key = storage_key(storage)
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
                        record = StorageRecord(storage, storage.nbytes(), i, source)
                        st.owned += (record,)
                    self.records[key] = record
                elif record.owner != i:
                    own_only = False  # (a view of another node's storage)
                    if record.owner in self.layout.bases.get(i, ()):
                        continue  # its base's memory, held and freed by its base alone (the schedule's count)
                    self.shared.add(record.owner)
                held[key] = record
            st.held = tuple(held.values())
            if managed and not self.plan.learnt:
                self.owned_sources[i] = tuple(record.source for record in st.owned) if own_only else None
        st.computed = True
        self._set_in_ram(i, True)
        if self.layout.binding.backward_of_forward.get(i) in self.plan.hook_at:
            self.hook_backward(i, hooked, defer=in_segment)

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
        names = [m.name for m in self.layout.binding.members[i]]
        for name, value in zip(names, members, strict=True):
            if isinstance(value, torch.Tensor):
                where.setdefault(storage_key(value.untyped_storage()), (name, None))
        for name, value in zip(names, members, strict=True):
            fn = value.grad_fn if isinstance(value, torch.Tensor) else None
            for attr in sorted(a for a in dir(fn) if a.startswith("_saved_")) if fn is not None else ():
                try:
                    saved = getattr(fn, attr)
                except (RuntimeError, ExecutionError):
                    continue
                if isinstance(saved, torch.Tensor):
                    where.setdefault(storage_key(saved.untyped_storage()), (name, attr))
        places = tuple(where.get(storage_key(record.storage)) for record in owned)
        return None if None in places else (places, st.n_packs)  # type: ignore[return-value]

    def _adopt(self, producer: int, storage: torch.UntypedStorage) -> StorageRecord:
        """A managed node's output shares unmanaged ``producer``'s memory (a view, an identity): the
        storage gets a record owned by the producer, held by it while it is in RAM, so that it is freed
        only when neither needs it."""
        st = self.state[producer]
        self.shared.add(producer)
        record = StorageRecord(storage, storage.nbytes(), producer, ("value", self.layout.external[producer][-1], 0))
        st.owned += (record,)
        st.held += (record,)
        if st.in_ram:
            record.refs += 1
        return record

    def hook_backward(self, i: int, value: object, defer: bool = False) -> None:
        """A pre-hook on the autograd nodes of forward node ``i``'s outputs (``value``), to drive the
        schedule; registered after the segment that runs ``i`` when ``defer`` (:meth:`_hook_pending`). The
        engine runs a group's autograd nodes one after another in decreasing creation order, so the
        output's node, created last, is the first of the group to run."""
        j = self.layout.binding.backward_of_forward.get(i)
        if j is None:
            return
        if not self.plan.learnt and isinstance(value, list):
            self.tensor_valued[i] = all(isinstance(v, torch.Tensor) for v in value)
        self.pending_hooks.append((j, tuple(t.grad_fn for t in tensors_in(value))))
        if not defer:
            self._hook_pending()

    def _hook_pending(self) -> None:
        """Register the pre-hooks collected in :attr:`pending_hooks` (each autograd node once).

        The list is emptied in place, never replaced: a segment's code fetches it once and appends to it
        after calls that may register hooks at once (:meth:`hook_backward` of a node whose values are not
        all tensors: nanoGPT's ``split``); the hooks it appended to a replaced list were never registered,
        so the learnt step's backward pass ran no schedule operation (a page-in never made)."""
        pending = list(self.pending_hooks)
        self.pending_hooks.clear()
        hooks: dict[int, Callable[..., None]] = {}
        for j, fns in pending:
            hook = hooks.get(j)
            if hook is None:
                hook = hooks[j] = lambda *_, j=j: self._advance_to_backward(j)
            for fn in fns:
                if fn is not None and fn not in self.seen_fns:
                    self.seen_fns.add(fn)
                    fn.register_prehook(hook)

    # -- autograd's saved tensors ---------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Saved | torch.Tensor:
        """Autograd saves ``t``: a parameter, buffer or unmanaged node's output is handed back as it is
        (nothing to check when it is read); a managed node's storage is saved with its record, checked
        when autograd reads it; a new storage is the running node's, to record when it finishes."""
        key = storage_key(t.untyped_storage())
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
            return Saved(t.detach(), PendingRecord(self, key))
        return Saved(t.detach(), record)

    def _pack_unchecked(self, t: torch.Tensor) -> torch.Tensor:
        """:meth:`_pack` once the first step has shown that every read finds its bytes in RAM (no prefetch,
        nothing fetched unplanned: :meth:`ScheduleExecutor._learn`). The same code reads the same storages
        at the same moments every step, so there is nothing left to check when autograd reads one: the
        saved tensor is only collected, and :meth:`finish` finds the node's storages among them. Still a
        Python call per saved tensor, but no record looked up, made or checked (the encoder's layer saves
        28 tensors)."""
        self.packs.append(t)  # type: ignore[union-attr]
        return t.detach()  # (never ``t``: a node that saves its own output would hold itself, see _recompute)

    def _unpack(self, saved: Saved | torch.Tensor) -> torch.Tensor:
        if type(saved) is not Saved:
            return saved  # (see _pack)
        record = saved.record
        if isinstance(record, PendingRecord):
            record = saved.record = record.resolve()
        if record is not None and self.state:
            self._ensure(record, "autograd")
        return saved.tensor

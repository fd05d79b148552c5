"""The step's records: storages and their owners (NOTE [1]), the nodes' states, the buffers' backup and the reruns' buffers (NOTE [3]), saved tensors (NOTE [4]). See docs/executor.md."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from poetlab.core.schedule import OpKind
from poetlab.techniques.bittrain import BitmapTensor
from poetlab.torch.probes import tensors_in
from poetlab.torch.execute.result import ExecutionError

if TYPE_CHECKING:
    from poetlab.torch.execute.step import StepRun


MISSING = object()
# autograd's saved-tensor hooks switched on and off without the context manager's three Python calls
# (what ``torch.autograd.graph.saved_tensors_hooks`` does inside), for the learnt steps' lean paths, once
# per managed node and per rerun (private calls of the pinned torch, checked for by
# ScheduleExecutor)
push_saved_hooks = getattr(torch._C._autograd, "_push_saved_tensors_default_hooks", None)
pop_saved_hooks = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
PUSHED = object()  # (StepRun.hooks while hooks pushed that way are on)
# sets tensors' version counters: a buffer that a node without the saved-tensor hooks saved, and that the
# step writes back to the very bytes it was saved with, gets its version back (ScheduleExecutor._without_hooks)
set_versions = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
COMPRESSION_OPS = frozenset({OpKind.COMPRESS, OpKind.DECOMPRESS, OpKind.FREE_COMPRESSED})


def storage_key(storage: torch.UntypedStorage) -> int:
    """Identity of a storage that survives resizing (the StorageImpl's address)."""
    return storage._cdata


def storages_of(values: Iterable[object]) -> list[torch.UntypedStorage]:
    """The storage of each tensor in ``values``, in order."""
    return [t.untyped_storage() for value in values for t in tensors_in(value)]


@dataclass(eq=False, slots=True)
class StorageRecord:
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
class NodeState:
    # (tuples, replaced when a node comes to own or hold storages: most never do, and a step makes one
    # state per node of the graph)
    owned: tuple[StorageRecord, ...] = ()
    held: tuple[StorageRecord, ...] = ()
    computed: bool = False
    in_ram: bool = False
    on_flash: bool = False
    paged: tuple[StorageRecord, ...] = ()  # (the storages of its last page-out, in the order of its file)
    rng_state: torch.Tensor | None = None
    n_packs: int = 0
    unmanaged_keys: tuple[int, ...] = ()  # storage keys of an unmanaged node's values, while they live
    # a graphless node's rerun, between it and its backward: (its values, its inputs, which were detached)
    rerun: tuple[tuple[object, ...], list[object], list[bool]] | None = None
    # a graphless node's first run's values, from it to its free (StepRun.graphless_in_segment)
    first_values: tuple[object, ...] | None = None


class BufferBackup:
    """A copy of a module's buffers (BatchNorm's running statistics, which the forward pass updates), taken
    at the start of every step: put back after a failure, and what the reruns' buffers are reset from
    (:class:`RerunBuffers`). ``copies[k]`` is ``buffers[k]``'s copy.

    Taken with one ``torch.cat`` per dtype of the 1-d buffers and one ``torch.stack`` per dtype of the 0-d
    ones (BatchNorm's ``num_batches_tracked``) into tensors allocated once, whose slices are the copies;
    only buffers of other shapes are copied one by one. ``torch._foreach_copy_`` on a CPU copies tensor by
    tensor, each through its own TensorIterator, which a model with many small buffers pays every step."""

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
class RerunBuffers:
    """The buffers of the forward nodes rerun in the backward pass that each rerun updates a second time
    (those of the modules a rerun calls as they are: not BatchNorm's, :class:`RerunBatchNorm`; a
    SyncBatchNorm's running statistics, a module's own buffers), and how a step gives them back the values
    its forward pass left.

    - Reset (``before_step``: their copies in the step's backup, ``ScheduleExecutor.step``): when each
      buffer is one node's alone and that node reruns once in the backward pass, the buffers are set back
      to the values the step began with just before the backward pass, and the reruns update them as
      their first runs did, to the same bits (the same batch statistics: a rerun gives the same bytes).
      One copy a step, and each rerun sees the buffers its first run saw. Only in steps that read
      unchecked (``ScheduleExecutor._learn``: nothing is fetched unplanned, so nothing reruns twice).
    - Kept (``kept``): otherwise (a module several nodes share, a node rerun twice, the first step) they
      are copied before the backward pass and put back after it, rather than around every rerun; a rerun runs on buffers that
      its first run has updated already (BatchNorm in training normalizes with the batch's statistics and
      only updates its running ones). The reset is one copy, where keeping and putting back are two."""

    buffers: list[torch.Tensor]
    kept: list[torch.Tensor]
    before_step: list[torch.Tensor] | None


class Saved:
    """What autograd holds for a saved tensor: a detached alias and the record of its storage."""

    __slots__ = ("tensor", "record")

    def __init__(self, tensor: torch.Tensor, record: object):
        self.tensor = tensor
        self.record = record


def unpack_unchecked(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def copy_buffers(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Put buffers back (``torch._foreach_copy_``) without autograd recording it, as ``torch.no_grad``
    would (a buffer may require grad), by grad mode's own switch, without the context manager's Python."""
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        torch._foreach_copy_(destinations, sources)
    finally:
        torch._C._set_grad_enabled(grad_was)


def never_unpacked(_: None) -> None:
    raise ExecutionError("a recompute's autograd graph was run backward; the executor never does that")


class PendingRecord:
    """A saved tensor packed while its node was still running: its storage record exists only once the
    node has finished, so the lookup waits until the tensor is unpacked."""

    __slots__ = ("run", "key")

    def __init__(self, run: StepRun, key: int):
        self.run = run
        self.key = key

    def resolve(self) -> StorageRecord | None:
        return self.run.records.get(self.key)

"""A step's state (:mod:`poetlab.torch.execute.state`): the buffers' backup and storage keys left by dead values."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.execute import state as execute_state
from poetlab.torch.execute.state import BufferBackup
from poetlab.torch.execute.step import StepRun
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate

from execute_cases import trace, patch_function, check_step


pytestmark = pytest.mark.usefixtures("deterministic_torch")


def test_the_buffers_backup_copies_each_buffer_and_is_made_again_for_a_resized_one():
    """BufferBackup joins the 1-d buffers and the 0-d ones of each dtype into one tensor each, whose slices
    are the copies; others are copied one by one. A buffer given another size (``.data = ...``) makes the
    join resize its tensor: ``take`` says so, and the step makes a new backup."""
    module = nn.Sequential(nn.BatchNorm1d(3), nn.BatchNorm2d(4))
    module.register_buffer("table", torch.randn(2, 3))
    buffers = [b for b in module.buffers() if b.numel()]
    backup = BufferBackup(buffers)
    assert backup.take()
    assert all(torch.equal(b, c) and b.shape == c.shape and b.dtype == c.dtype for b, c in zip(buffers, backup.copies, strict=True))
    for b in buffers:
        b.add_(1)
    assert not any(torch.equal(b, c) for b, c in zip(buffers, backup.copies, strict=True))
    module[0].running_mean.data = torch.arange(5.0)
    with pytest.warns(UserWarning):
        assert not backup.take()
    backup = BufferBackup(buffers)
    (k,) = [k for k, b in enumerate(buffers) if b is module[0].running_mean]
    assert backup.take() and torch.equal(backup.copies[k], torch.arange(5.0))


class _Fork(nn.Module):
    """m = a(x), p = m + b(x), q = c(p), d(q * m): the add saves neither input, so b's output dies when the
    add has read it."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(64, 64 if k < 3 else 10) for k in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.a(x)
        q = self.c(m + self.b(x))
        return self.d(q * m)


def test_a_storage_key_left_by_a_dead_value_is_not_taken_for_its_producers(monkeypatch):
    """The executor knows an unmanaged node's storages by key (the StorageImpl's address) while a packed
    node may save or view them (StepRun.track_values). A segment's code drops a value at its last use, which
    the schedule may place before its free: ``b``'s output here, read by the add (packed: it reads ``a``,
    which the schedule reruns) and freed after ``c``. A storage made after it died may be given its
    StorageImpl's address (the allocator's next one of that size, often): emulated here by giving that key
    to the first new storage whose key the step asks for while it finishes a managed node, ``c``'s output
    (paged out and in). Taken for ``b``'s, that output would be held by ``b`` and emptied at ``b``'s free,
    before the multiplication reads it; known dead (a weak reference to the storage), it is ``c``'s own:
    three steps give a plain step's gradients and counts (``check_step``)."""
    torch.manual_seed(0)
    module, inputs, targets = _Fork(), torch.randn(8, 64), torch.randint(0, 10, (8,))
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    a, b, c, mul, grad_mul = index["a"], index["b"], index["c"], index["mul"], index["grad:mul"]
    ops = list(checkpoint_all_schedule(graph).ops)

    def at(kind, node):
        return next(k for k, op in enumerate(ops) if op.kind is kind and op.node == node)

    def insert(k, *kinds_nodes):
        ops[k:k] = [poetlab.Op(kind, node, ops[k - 1].stage) for kind, node in kinds_nodes]  # (the stage of the op before)

    for node in (b, a, c):
        del ops[at(OpKind.FREE, node)]
    insert(at(OpKind.COMPUTE, c) + 1, (OpKind.FREE, b))
    insert(at(OpKind.COMPUTE, mul) + 1, (OpKind.PAGE_OUT, c), (OpKind.FREE, c), (OpKind.FREE, a))
    k = at(OpKind.COMPUTE, grad_mul)
    ops[k:k] = [poetlab.Op(OpKind.COMPUTE, a, ops[k].stage), poetlab.Op(OpKind.PAGE_IN, c, ops[k].stage)]
    insert(at(OpKind.COMPUTE, grad_mul) + 1, (OpKind.FREE, a))
    insert(at(OpKind.COMPUTE, index["grad:c"]) + 1, (OpKind.FREE, c))
    schedule = poetlab.Schedule(graph.n_nodes, tuple(ops))
    predicted = simulate(schedule, graph, costs)
    assert predicted.n_recomputes == 1 and predicted.n_pageouts == 1

    real_key, real_track, real_finish = execute_state.storage_key, StepRun.track_values, StepRun.finish
    # a storage's real key -> the key it is given and a weak reference to it; the real allocator may reuse a dead
    # storage's address too, so a key is handed over only where no live storage has it (else two live storages
    # would share a key, which no allocator does: that made this test depend on the suite's earlier allocations)
    given: dict[int, tuple[int, weakref.ref]] = {}
    died: list[int] = []  # the keys of tracked storages that have died
    finishing: list[bool] = [False]
    handed: list[int] = []  # the keys the emulation handed over
    fresh = iter(range(-1, -(10**9), -1))  # (keys no address has, for a storage whose real key a live one was given)

    def taken(k):
        return any(g == k and ref() is not None for g, ref in given.values())

    def key(storage):
        real = real_key(storage)
        entry = given.get(real)
        if entry is not None and entry[1]() is storage:
            return entry[0]
        free = [k for k in died if not taken(k)] if finishing[0] else []
        if free:
            k = free[-1]
            died.remove(k)
            handed.append(k)
        else:
            k = real if not taken(real) else next(fresh)
        given[real] = (k, weakref.ref(storage))
        return k

    def track(run, i, storages):
        for storage in storages:
            weakref.finalize(storage, died.append, key(storage))
        real_track(run, i, storages)

    def finish(run, i, *args, **kwargs):
        finishing[0] = i in run.layout.managed
        try:
            return real_finish(run, i, *args, **kwargs)
        finally:
            finishing[0] = False

    patch_function(monkeypatch, "storage_key", key)
    monkeypatch.setattr(StepRun, "track_values", track)
    monkeypatch.setattr(StepRun, "finish", finish)
    check_step("fork", False, schedule, graph, costs, module, inputs, targets)
    assert handed  # (a dead storage's key was given to a new one: the emulation took place)


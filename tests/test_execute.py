"""Executing schedules for real: gradients equal plain autograd bit for bit, memory as predicted, faults.

Small sizes (a width-8 ResNet-18 at 16x16, MobileNetV2 x0.35 at 32x32, the 2-layer encoder) at budgets
that force recomputation, paging, or both (greedy schedules, and POET's MILP on the m4 platform, whose
costs make it mix the two). Every step is checked against a plain ``loss.backward()`` from the same
weights and RNG state, with deterministic algorithms on.

Memory allowance. The executor's peak is measured from the allocator, without the parameters'
gradients (left out by address: POET keeps them outside the activation budget, its ``fixed_bytes``);
the simulator's counts the graph's tensors only. The difference we allow is one operation's transient
workspace, bounded by :func:`poetlab.torch.execute.memory_allowance_bytes`: a convolution's im2col buffer
(kernel area x the largest tensor) plus one more largest tensor (autograd summing two gradient
contributions of a skip connection before passing them on).
"""

from __future__ import annotations

import copy
import errno
import gc
import importlib
import os
import pkgutil
import platform
import subprocess
import sys
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import poetlab
import poetlab.torch.execute
from poetlab.torch.execute import ExecutionError, ScheduleExecutor, execute, memory_allowance_bytes
from poetlab.torch.execute import executor as execute_executor
from poetlab.torch.execute import layout as execute_layout
from poetlab.torch.execute import state as execute_state
from poetlab.torch.execute.layout import node_buffers
from poetlab.torch.execute.segments import COMPUTE, RECOMPUTED_BATCH
from poetlab.torch.execute.state import BufferBackup
from poetlab.torch.execute.step import StepRun


def _patch_function(monkeypatch, name: str, value: object) -> None:
    """Set the public function ``name`` of :mod:`poetlab.torch.execute.state` (the executor's one wrapper
    of a call of the pinned torch, or its storage keys) in every module of the executor that imports it."""
    for info in pkgutil.iter_modules(poetlab.torch.execute.__path__):
        module = importlib.import_module(f"poetlab.torch.execute.{info.name}")
        if getattr(module, name, None) is getattr(execute_state, name):
            monkeypatch.setattr(module, name, value)
from poetlab.planners.baselines import capuchin
from poetlab.planners.baselines.base import Budgets
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.torch.paging import PageStore, PagingError
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.torch.models import MobileNetV2, ResNet18, build_torch_model
from poetlab.torch.probes import tensors_in
from poetlab.torch.trace import trace


pytestmark = pytest.mark.usefixtures("deterministic_torch")


def _case(name: str):
    """(module, inputs, targets) at test size, seeded."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "resnet":
        return ResNet18(10, width=8).train(), torch.randn(2, 3, 16, 16, generator=generator), torch.tensor([1, 7])
    if name == "mobilenet":
        return MobileNetV2(10, 0.35).train(), torch.randn(2, 3, 32, 32, generator=generator), torch.tensor([3, 4])
    model = build_torch_model("bert_small_torch", 2, seed=0)
    return model.module, model.inputs, model.targets


_GRAPHS: dict[tuple[str, bool], tuple] = {}


def _traced(name: str, fuse: bool, platform: str = "a72"):
    key = (name, fuse)
    if key not in _GRAPHS:
        module, inputs, targets = _case(name)
        _GRAPHS[key] = (module, inputs, targets, trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=fuse))
    module, inputs, targets, graph = _GRAPHS[key]
    return module, inputs, targets, graph, poetlab.CostModel.from_flops(graph, poetlab.load_platform(platform))


def _alive_runs() -> int:
    """How many executed steps' states are alive, after a full collection."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is StepRun)


def _grads(module: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


#: what a step of the executor's fast path must share with the reference step's (NOTE [8]; the loss too, on the
#: same random numbers)
_SAME_AS_REFERENCE = (
    "n_computes", "n_recomputes", "n_pageouts", "n_pageins", "n_unplanned", "n_skipped_ops",
    "planned_peak_bytes", "bytes_written", "bytes_read", "n_compresses", "n_decompresses", "compressed_bytes",
)


def _check_step(name, fuse, schedule, graph, costs, module, inputs, targets, **options):
    """Run ``schedule`` and plain steps from the same state, three times with one executor (the second step
    runs with what the first showed to be needed: NOTE [8]); assert equality after each, and the same
    counts, bytes paged and planned peak as the reference step's (``fast=False``, run once beside the first:
    the same step on the same weights); return the last result."""
    loss_fn = nn.CrossEntropyLoss()
    plain, scheduled, specified = copy.deepcopy(module), copy.deepcopy(module), copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, loss_fn, **options)
    reference = ScheduleExecutor(specified, graph, schedule, loss_fn, **options, fast=False)
    predicted = simulate(schedule, graph, costs)
    for step in range(3):
        rng = torch.get_rng_state()
        plain_loss = loss_fn(plain(inputs), targets)
        plain_loss.backward()  # (gradients accumulate over the steps, on both sides)
        rng_after = torch.get_rng_state()
        runs = ((executor, scheduled), (reference, specified)) if step == 0 else ((executor, scheduled),)
        results = []
        for run, model in runs:
            torch.set_rng_state(rng)
            results.append(run.step(inputs, targets, measure_memory=True))
            assert torch.equal(torch.get_rng_state(), rng_after)  # recomputes replay random numbers, never draw new ones
            assert results[-1].loss == float(plain_loss.detach())
            for (pname, _), a, b in zip(plain.named_parameters(), _grads(plain), _grads(model), strict=True):
                assert (a is None) == (b is None), pname
                assert a is None or torch.equal(a, b), f"{name}, step {step + 1}: gradient of {pname} differs"
            for a, b in zip(plain.buffers(), model.buffers(), strict=True):
                assert torch.equal(a, b)
        if step == 0:
            specification = results[1]
        result = results[0]
        assert [getattr(result, f) for f in _SAME_AS_REFERENCE] == [getattr(specification, f) for f in _SAME_AS_REFERENCE]
        _check_counts(schedule, graph, module, result, predicted)
    assert executor.plan.learnt and not reference.plan.learnt and not reference.plan.segments
    return replace(result, predicted=predicted)


def _check_counts(schedule, graph, module, result, predicted):
    assert result.n_unplanned == 0
    # every planned operation on a tensor of the step was carried out: no planner may page or recompute a
    # gradient of a traced graph (TrainingGraph.pinned); the caller's batch stays the caller's (its frees
    # and page-outs are left out and counted, a "recompute" of it is a no-op)
    batch = {i for i, node in enumerate(graph.nodes) if node.kind == "input"}
    assert result.n_recomputes == predicted.n_recomputes
    assert result.n_computes == schedule.count(OpKind.COMPUTE)
    assert result.n_pageouts == predicted.n_pageouts - sum(op.kind is OpKind.PAGE_OUT and op.node in batch for op in schedule.ops)
    assert result.n_skipped_ops == sum(op.kind in (OpKind.FREE, OpKind.PAGE_OUT, OpKind.PAGE_IN) and op.node in batch for op in schedule.ops)
    if predicted.n_compresses:  # compressed copies at their real size, the simulator's at a margined density
        assert result.planned_peak_bytes <= predicted.peak_ram_bytes
    else:
        assert result.planned_peak_bytes == predicted.peak_ram_bytes
    allowance = memory_allowance_bytes(module, graph)
    assert result.peak_bytes <= predicted.peak_ram_bytes + allowance, (result.peak_bytes, predicted.peak_ram_bytes, allowance)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    assert result.peak_bytes <= result.total_peak_bytes <= result.peak_bytes + param_bytes


def _full(graph, costs) -> int:
    return simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes


@pytest.mark.parametrize("name, fuse", [("resnet", False), ("resnet", True), ("mobilenet", True)])
def test_remat_and_paging_schedules_give_autograds_gradients(name, fuse):
    module, inputs, targets, graph, costs = _traced(name, fuse)
    full = _full(graph, costs)
    remat = greedy_remat_schedule(graph, costs, 0.6 * full)
    paging = greedy_paging_schedule(graph, costs, 0.6 * full)
    assert remat is not None and remat.n_recomputes > 0
    assert paging is not None and paging.count(OpKind.PAGE_OUT) > 0
    result = _check_step(name, fuse, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0 and result.bytes_written == 0
    result = _check_step(name, fuse, paging, graph, costs, module, inputs, targets)
    assert result.n_pageouts > 0 and result.bytes_written > 0 and result.bytes_read > 0
    assert result.peak_bytes < _check_step(name, fuse, checkpoint_all_schedule(graph), graph, costs, module, inputs, targets).peak_bytes


def test_encoder_recompute_replays_dropout():
    """The encoder's transformer layers draw dropout masks: a recomputed layer must draw the same."""
    module, inputs, targets, graph, costs = _traced("bert", False)
    remat = greedy_remat_schedule(graph, costs, 0.95 * _full(graph, costs))
    assert remat is not None
    computes = [graph.nodes[op.node].name for op in remat.ops if op.kind is OpKind.COMPUTE]
    assert any(name.startswith("layers") and computes.count(name) > 1 for name in computes)
    result = _check_step("bert", False, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0


def test_milp_schedule_and_a_schedule_mixing_recompute_and_paging():
    """POET's own schedule (m4 costs, 45% of checkpoint-all: it pages), and Capuchin's on a72 costs at 55%,
    which recomputes and pages in one step. (With a traced graph's gradients pinned, POET's MILP picks
    one lever or the other on this small model.)"""
    module, inputs, targets, graph, costs = _traced("resnet", True, platform="m4")
    solved = poetlab.solve(graph, costs, 0.45 * _full(graph, costs) + graph.workspace_bytes, time_limit_s=10)  # (solve keeps the workspace free)
    assert solved.schedule is not None and solved.n_pageouts > 0
    _, _, _, _, a72 = _traced("resnet", True, platform="a72")
    mixed = capuchin.plan(graph, a72, Budgets(0.55 * _full(graph, a72), None))
    predicted = simulate(mixed, graph, a72)
    assert predicted.n_recomputes > 0 and predicted.n_pageouts > 0
    for schedule, schedule_costs in ((solved.schedule, costs), (mixed, a72)):
        for prefetch in (False, True):
            result = _check_step("resnet", True, schedule, graph, schedule_costs, module, inputs, targets, prefetch=prefetch)
            batch_pageins = sum(op.kind is OpKind.PAGE_IN and graph.nodes[op.node].kind == "input" for op in schedule.ops)
            assert result.n_pageins == result.predicted.n_pageins - batch_pageins > 0 and result.prefetch is prefetch


def _sync_norms(module: nn.Module) -> nn.Module:
    """``module`` with its BatchNorm layers made ``nn.SyncBatchNorm`` (without a process group, BatchNorm's
    computation): a class the reruns call as it is (``RerunBatchNorm`` takes exactly BatchNorm1d/2d/3d), so
    that they update its running statistics a second time, as they would any module that writes its
    buffers in its forward pass: what ``RerunBuffers`` undoes."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(module)


class _SharedNorm(nn.Module):
    """Three convolutions normalized by one BatchNorm: its running statistics are updated by three nodes."""

    def __init__(self, norm: type[nn.BatchNorm2d] = nn.BatchNorm2d):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (nn.Conv2d(c, 8, 3, padding=1) for c in (3, 8, 8))
        self.norm = norm(8)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        for conv in (self.conv1, self.conv2, self.conv3):
            x = torch.relu(self.norm(conv(x)))
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize("norm", [nn.BatchNorm2d, nn.SyncBatchNorm], ids=["BatchNorm2d", "SyncBatchNorm"])
def test_a_rerun_leaves_a_shared_batchnorm_as_a_plain_step_does(norm):
    """A rerun in the backward pass of a node whose BatchNorm nodes that are not rerun update too: a
    BatchNorm runs through its stand-in, which writes none of its statistics (``RerunBatchNorm``); a
    SyncBatchNorm updates them a second time, and they are put back after the backward pass
    (ScheduleExecutor.rerun_buffers). Either way the running statistics are a plain step's."""
    torch.manual_seed(0)
    module, inputs, targets = _SharedNorm(norm).train(), torch.randn(2, 3, 16, 16), torch.tensor([1, 2])
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.8 * _full(graph, costs))
    computes = [graph.nodes[op.node].name for op in schedule.ops if op.kind is OpKind.COMPUTE]
    assert "conv1" in computes[computes.index("grad:loss"):]  # (a rerun in the backward pass)
    _check_step("shared norm", True, schedule, graph, costs, module, inputs, targets)


def test_reruns_reset_the_batchnorms_of_their_node_alone_and_keep_shared_ones():
    """Reruns of modules that write their buffers (SyncBatchNorm here, which the reruns call as it is): a
    node rerun once in the backward pass, whose module no other node uses, gets the buffers' values from
    the start of the step back before the backward pass, and its rerun updates them to the same bits as
    its first run did (one copy, no putting back: RerunBuffers); a module that other nodes update too is
    kept and put back. Either way the running statistics are a plain step's, step after step."""
    torch.manual_seed(0)
    cases = [("mobilenet", _sync_norms(MobileNetV2(10, 0.35)).train(), torch.randn(2, 3, 32, 32), torch.tensor([3, 4]), 0.6, True),
             ("shared", _SharedNorm(nn.SyncBatchNorm).train(), torch.randn(2, 3, 16, 16), torch.tensor([1, 2]), 0.8, False)]
    for name, module, inputs, targets, fraction, alone in cases:
        graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
        costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
        schedule = greedy_remat_schedule(graph, costs, fraction * _full(graph, costs))
        reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
        executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
        assert executor.layout.rerun_in_backward, name
        for _ in range(4):
            rng = torch.get_rng_state()  # (MobileNetV2's dropout: the same masks on both sides)
            nn.CrossEntropyLoss()(reference(inputs), targets).backward()
            torch.set_rng_state(rng)
            executor.step(inputs, targets)
            for a, b in zip([*reference.buffers(), *_grads(reference)], [*scheduled.buffers(), *_grads(scheduled)], strict=True):
                assert torch.equal(a, b), name
        rerun = executor.rerun_buffers()
        assert rerun.buffers and (rerun.before_step is not None) == alone and executor.plan.unchecked_reads, name
        # (a node that saved a kept and put-back buffer keeps the saved-tensor hooks: ScheduleExecutor._without_hooks)
        kept = {id(b) for b in rerun.buffers} if not alone else set()
        assert not any(id(b) in kept for i in executor.plan.hookless for b in node_buffers(executor.layout, i)), name
        assert not alone or executor.plan.hookless.keys() & executor.layout.rerun_in_backward, name


def test_reruns_run_batchnorm_through_a_stand_in_that_leaves_its_statistics_alone():
    """A rerun calls each BatchNorm (exactly BatchNorm's classes, without hooks of its own) through a
    ``RerunBatchNorm``: in training, the same batch statistics, with running statistics of its own, so the
    module's are written once a step, by its first run; nothing is reset or put back (no rerun buffers).
    Gradients and buffers are a plain step's in training (a stand-in that wrote the module's statistics
    would leave them updated twice) and in eval mode (the module itself runs: it writes nothing). A
    BatchNorm with a forward hook is called as it is, its hook runs, and its buffers are reset again."""
    module, inputs, targets, graph, costs = _traced("mobilenet", True)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    stand_ins = {t for code in executor.layout.rerun_code if code is not None for t in code.stand_ins}
    rerun = {m.target for i in executor.layout.rerun_in_backward for m in executor.binding.members[i] if m.op == "call_module"}
    assert stand_ins and stand_ins == {t for t in rerun if type(executor.modules[t]) is nn.BatchNorm2d}
    assert executor.layout.rerun_in_backward and not executor.rerun_buffers().buffers
    _check_step("mobilenet", True, schedule, graph, costs, module, inputs, targets)
    _check_step("mobilenet in eval mode", True, schedule, graph, costs, copy.deepcopy(module).eval(), inputs, targets)
    hooked, calls = copy.deepcopy(module), []
    target = sorted(stand_ins)[0]
    hooked.get_submodule(target).register_forward_hook(lambda *_: calls.append(target))
    executor = ScheduleExecutor(copy.deepcopy(hooked), graph, schedule, nn.CrossEntropyLoss())
    assert target not in {t for code in executor.layout.rerun_code if code is not None for t in code.stand_ins}
    assert {id(b) for b in executor.rerun_buffers().buffers} == {id(b) for b in executor.modules[target].buffers() if b.numel()}
    executor.step(inputs, targets)
    assert len(calls) == 2  # (the first run and the rerun)
    _check_step("mobilenet, a hooked BatchNorm", True, schedule, graph, costs, hooked, inputs, targets)


@pytest.mark.parametrize("planner", [greedy_paging_schedule, greedy_remat_schedule])
def test_repeated_steps_with_one_executor_accumulate_like_backward(planner):
    """Gradients accumulate over steps as ``backward`` does. From the second step on, every parameter and
    buffer gets a new storage first (``p.data = ...``): after its first step the executor looks up only
    the storages of the constants its managed nodes met (ScheduleExecutor._learn), but on every step, so
    a new storage still counts as a constant, never as a managed node's to free."""
    module, inputs, targets, graph, costs = _traced("resnet", True)
    schedule = planner(graph, costs, 0.6 * _full(graph, costs))
    loss_fn = nn.CrossEntropyLoss()
    reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, loss_fn)
    for step in range(3):
        if step:
            for tensor in [*scheduled.parameters(), *scheduled.buffers()]:
                tensor.data = tensor.data.clone()
        loss_fn(reference(inputs), targets).backward()
        executor.step(inputs, targets)
        for a, b in zip(_grads(reference), _grads(scheduled), strict=True):
            assert torch.equal(a, b)
        for tensor in [*scheduled.parameters(), *scheduled.buffers()]:
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    met = executor.plan.constants_met
    assert met is not None and 0 < len(met) < len(executor.constants)


# ---- faults -----------------------------------------------------------------------------------


def test_a_torch_without_the_private_calls_is_one_clear_error(monkeypatch):
    """The executor relies on calls of the pinned torch that are not public API (the saved-tensor hooks
    pushed without their context manager, UntypedStorage._swap_data_ptr_): another torch gets one clear
    error naming the fix when the executor is made, not an AttributeError in the middle of a step."""
    module, inputs, targets, graph, costs = _traced("resnet", True)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    monkeypatch.setattr(execute_executor, "push_saved_hooks", None)
    with pytest.raises(ExecutionError, match="install the pinned torch"):
        ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())


def _paging_setup(with_grads: bool = True):
    module, inputs, targets, graph, costs = _traced("resnet", True)
    schedule = greedy_paging_schedule(graph, costs, 0.6 * _full(graph, costs))
    module = copy.deepcopy(module)
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.5) if with_grads else None
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    grads = _grads(module)
    return module, inputs, targets, graph, schedule, before, grads


def _assert_untouched(module, before, grads, paging_root: Path):
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    for a, b in zip(_grads(module), grads, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert list(paging_root.iterdir()) == []


def test_disk_full_mid_step_is_one_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    module, inputs, targets, graph, schedule, before, grads = _paging_setup()
    real_write = PageStore.write
    calls = []

    def write(self, key, storage):
        calls.append(key)
        if len(calls) == 2:
            real = os.open
            monkeypatch.setattr(os, "open", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
            try:
                return real_write(self, key, storage)
            finally:
                monkeypatch.setattr(os, "open", real)
        return real_write(self, key, storage)

    monkeypatch.setattr(PageStore, "write", write)
    with pytest.raises(PagingError) as caught:
        execute(module, schedule, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), paging_dir=str(tmp_path), measure_memory=False)
    message = str(caught.value)
    assert "\n" not in message and "No space left on device" in message and "free disk space" in message
    _assert_untouched(module, before, grads, tmp_path)


def test_paging_directory_removed_mid_step(tmp_path, monkeypatch):
    """The directory vanishes after the first page-out: the next page-out or page-in fails with one
    line, and nothing is left changed."""
    module, inputs, targets, graph, schedule, before, grads = _paging_setup()
    real_write = PageStore.write

    def write(self, key, storage):
        real_write(self, key, storage)
        for child in self.directory.iterdir():
            child.unlink()
        self.directory.rmdir()

    monkeypatch.setattr(PageStore, "write", write)
    with pytest.raises(PagingError) as caught:
        execute(module, schedule, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), paging_dir=str(tmp_path), measure_memory=False)
    assert "\n" not in str(caught.value) and "paging directory disappeared" in str(caught.value)
    _assert_untouched(module, before, grads, tmp_path)


@pytest.mark.parametrize("with_grads", [True, False], ids=["grads", "no-grads"])
def test_a_failure_in_the_backward_pass_gives_back_the_callers_gradients(tmp_path, monkeypatch, with_grads):
    """The directory vanishes after the last page-out, so the first page-in fails in the backward pass,
    once autograd has given parameters gradients: they go, and the caller's are back (none where it had
    none: the executor keeps no list of them then)."""
    module, inputs, targets, graph, schedule, before, grads = _paging_setup(with_grads)
    n_pageouts = sum(op.kind is OpKind.PAGE_OUT for op in schedule.ops)
    real_write = PageStore.write
    accumulated, written = [], []
    for p in module.parameters():
        p.register_post_accumulate_grad_hook(accumulated.append)

    def write(self, key, storage):
        real_write(self, key, storage)
        written.append(key)
        if len(written) == n_pageouts:
            for child in self.directory.iterdir():
                child.unlink()
            self.directory.rmdir()

    monkeypatch.setattr(PageStore, "write", write)
    with pytest.raises(PagingError, match="paging directory disappeared"):
        execute(module, schedule, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), paging_dir=str(tmp_path), measure_memory=False)
    assert accumulated  # (the failure came after autograd had accumulated gradients)
    _assert_untouched(module, before, grads, tmp_path)
    assert all((p.grad is None) != with_grads for p in module.parameters())


def test_paging_files_are_private_and_removed(tmp_path, monkeypatch):
    module, inputs, targets, graph, schedule, _, _ = _paging_setup()
    modes, sizes = [], []
    real_write = PageStore.write

    def write(self, key, storages):
        real_write(self, key, storages)
        modes.append((self.directory.stat().st_mode & 0o777, self.path(key).stat().st_mode & 0o777))
        sizes.append((self.path(key).stat().st_size, [s.nbytes() for s in storages]))

    monkeypatch.setattr(PageStore, "write", write)
    result = execute(module, schedule, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), paging_dir=str(tmp_path), measure_memory=False)
    assert modes and set(modes) == {(0o700, 0o600)}
    assert list(tmp_path.iterdir()) == []
    # one file per page-out, with all the storages the node owns (a fused conv group: its convolution's
    # and its BatchNorm's outputs, and the statistics BatchNorm saved), read back from their offsets
    assert len(sizes) == result.n_pageouts == sum(op.kind is OpKind.PAGE_OUT for op in schedule.ops)
    assert all(size == sum(parts) for size, parts in sizes) and max(len(parts) for _, parts in sizes) > 1
    assert result.bytes_written == sum(size for size, _ in sizes) and result.bytes_read > 0


def test_a_schedule_that_drops_what_autograd_needs_is_refused():
    """Free a convolution group before the backward pass that reads it: strict refuses with one line;
    non-strict fetches it (a recompute) and counts it."""
    module, inputs, targets, graph, costs = _traced("resnet", True)
    ops = list(checkpoint_all_schedule(graph).ops)
    conv = next(i for i, node in enumerate(graph.nodes) if node.kind.startswith("Conv2d"))
    first_backward = next(k for k, op in enumerate(ops) if graph.nodes[op.node].is_backward)
    ops = [op for op in ops if not (op.kind is OpKind.FREE and op.node == conv)]
    ops.insert(first_backward - 1, poetlab.Op(OpKind.FREE, conv, ops[first_backward - 1].stage))
    broken = poetlab.Schedule(graph.n_nodes, tuple(ops))
    runs = _alive_runs()
    with pytest.raises(ExecutionError, match="does not hold"):
        execute(copy.deepcopy(module), broken, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), measure_memory=False)
    assert _alive_runs() == runs  # (a step that failed midway in the backward pass leaves nothing behind)
    result = execute(copy.deepcopy(module), broken, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), strict=False, measure_memory=False)
    assert result.n_unplanned > 0


def test_a_step_that_fails_inside_a_managed_node_leaves_no_hooks_behind():
    """A managed node's first run inside a generated segment has the saved-tensor hooks switched on
    around it. A module that raises there (on the second step, after the executor has learnt) must leave
    the hooks off, no step state alive, and the model as it was: the next step is plain autograd's."""
    module, inputs, targets, graph, costs = _traced("mobilenet", True)
    loss_fn = nn.CrossEntropyLoss()
    remat = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, remat, loss_fn)
    in_segments = {p for s in executor.plan.segments.values() for p in range(s.start, s.end)}
    managed = next(
        i for i in sorted(executor.layout.managed)
        if executor.layout.computed_at[i] in in_segments and any(m.op == "call_module" for m in executor.binding.members[i])
    )
    failing = executor.modules[next(m.target for m in executor.binding.members[managed] if m.op == "call_module")]

    def step_both():  # (from the same RNG state: the classifier's dropout)
        rng = torch.get_rng_state()
        loss_fn(reference(inputs), targets).backward()
        torch.set_rng_state(rng)
        executor.step(inputs, targets)

    step_both()
    before = {k: v.detach().clone() for k, v in scheduled.state_dict().items()}
    grads = _grads(scheduled)
    runs = _alive_runs()
    failing.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        executor.step(inputs, targets)
    del failing.forward
    assert _alive_runs() == runs  # (the hooks, had they stayed on, would hold the step's state)
    for k, v in scheduled.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(a, b) for a, b in zip(_grads(scheduled), grads, strict=True))
    step_both()
    assert all(torch.equal(a, b) for a, b in zip(_grads(reference), _grads(scheduled), strict=True))


def test_graph_of_another_module_is_refused():
    _, inputs, targets, graph, _ = _traced("resnet", True)
    other = ResNet18(10, width=4)
    with pytest.raises(ExecutionError, match="trace"):
        execute(other, checkpoint_all_schedule(graph), (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss())


class _SparseChain(nn.Module):
    """Four Conv+ReLU at 16x16, biases shifted down so that the ReLU outputs are about half zeros."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*[layer for c in (3, 8, 8, 8) for layer in (nn.Conv2d(c, 8, 3, padding=1), nn.ReLU())])
        self.head = nn.Linear(8 * 16 * 16, 10)
        with torch.no_grad():
            for layer in self.body[::2]:
                layer.bias.sub_(0.05)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


def _compression_case():
    from poetlab.techniques.compression import compression_costs, graph_densities

    torch.manual_seed(0)
    module = _SparseChain().train()
    inputs, targets = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([1, 7])
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets)
    relus = [i for i, node in enumerate(graph.nodes) if node.kind == "ReLU"]
    densities = graph_densities(module, inputs, nn.CrossEntropyLoss(), targets, graph)
    platform = poetlab.load_platform("m4")
    costs = poetlab.CostModel.from_flops(graph, platform).with_compression(compression_costs(graph, platform, densities))
    assert costs.compression.allowed[relus].all()
    return module, inputs, targets, graph, costs, relus


def _check_compressed_step(schedule, graph, costs, module, inputs, targets):
    result = _check_step("chain", False, schedule, graph, costs, module, inputs, targets)
    predicted = result.predicted
    assert result.n_compresses == predicted.n_compresses > 0
    assert result.n_decompresses == predicted.n_decompresses > 0
    assert 0 < result.compressed_bytes < result.n_compresses * int(graph.output_bytes.max())
    return result


def test_milp_schedule_with_compression_runs_compressed():
    """POET+compression's own schedule: the ReLU outputs it keeps compressed come back bit for bit."""
    module, inputs, targets, graph, costs, _ = _compression_case()
    solved = poetlab.solve(graph, costs, 0.9 * _full(graph, costs) + graph.workspace_bytes, 2.0, compression=True, time_limit_s=8)
    assert solved.schedule is not None and solved.n_compresses > 0
    _check_compressed_step(solved.schedule, graph, costs, module, inputs, targets)


def test_hand_made_compression_schedule():
    """Compress a ReLU output, free it, decompress it for the backward pass, then drop the copy."""
    from poetlab.core.schedule import Op, Schedule

    module, inputs, targets, graph, costs, relus = _compression_case()
    relu, ops = relus[1], []
    plain = checkpoint_all_schedule(graph).ops
    first_backward = next(k for k, op in enumerate(plain) if op.kind is OpKind.COMPUTE and graph.nodes[op.node].is_backward)
    for k, op in enumerate(plain):
        if k == first_backward:
            ops += [Op(OpKind.DECOMPRESS, relu, op.stage), Op(OpKind.FREE_COMPRESSED, relu, op.stage)]
        ops.append(op)
        if op.kind is OpKind.COMPUTE and op.node == relu + 1:  # the next layer has read it
            ops += [Op(OpKind.COMPRESS, relu, op.stage), Op(OpKind.FREE, relu, op.stage)]
    schedule = Schedule(graph.n_nodes, tuple(ops))
    full = simulate(checkpoint_all_schedule(graph), graph, costs)
    result = _check_compressed_step(schedule, graph, costs, module, inputs, targets)
    assert result.predicted.energy_j > full.energy_j


def test_idle_compression_of_a_resnet_schedule_runs_with_autograds_gradients():
    """A fused ResNet-18's remat schedule with every idle Conv+BN+ReLU output kept compressed (densities
    measured per traced node): same computes, less memory, gradients bit-equal to autograd."""
    from poetlab.planners.compression import compress_idle
    from poetlab.techniques.compression import compression_costs, graph_densities

    module, inputs, targets, graph, _ = _traced("resnet", True, platform="m4")
    platform = poetlab.load_platform("m4")
    densities = graph_densities(module, inputs, nn.CrossEntropyLoss(), targets, graph)
    costs = poetlab.CostModel.from_flops(graph, platform).with_compression(compression_costs(graph, platform, densities))
    remat = greedy_remat_schedule(graph, costs, 0.8 * _full(graph, costs))
    assert remat is not None
    idle = compress_idle(remat, graph, costs.compression)
    before, after = simulate(remat, graph, costs), simulate(idle, graph, costs)
    assert after.peak_ram_bytes < before.peak_ram_bytes and after.n_compresses > 0
    assert after.energy_j == pytest.approx(before.energy_j + after.compression_energy_j)
    assert [op for op in idle.ops if op.kind is OpKind.COMPUTE] == [op for op in remat.ops if op.kind is OpKind.COMPUTE]
    _check_compressed_step(idle, graph, costs, module, inputs, targets)


def test_recompute_before_a_group_without_its_own_autograd_node():
    """An identity shortcut has no autograd node of its own: its backward pre-hook lands on the node of
    the tensor it passes on and fires late. A recompute the schedule places just before that group's
    backward must still be done before autograd's next read: every later backward node is hooked on the
    first step, and from the second on those whose pre-hook then had work to do."""
    module, inputs, targets, graph, costs = _traced("resnet", True)
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    # block 0's output: read by block 1's forward and by grad:blocks_1_conv1 (its conv's saved input).
    # Freed before grad:blocks_1_conv2, recomputed (with the identity shortcut it reads, freed long
    # since) just before grad:blocks_1_shortcut, whose pre-hook fires only after grad:blocks_1_conv1 ran.
    x, shortcut_in, late = index["blocks_0_conv2"], index["blocks_0_shortcut"], index["grad:blocks_1_shortcut"]
    ops = list(checkpoint_all_schedule(graph).ops)
    ops.remove(next(op for op in ops if op.kind is OpKind.FREE and op.node == x))
    conv2 = next(k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.node == index["grad:blocks_1_conv2"])
    ops.insert(conv2, poetlab.Op(OpKind.FREE, x, ops[conv2].stage))
    before = next(k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.node == late)
    stage = ops[before].stage
    recompute = [poetlab.Op(OpKind.COMPUTE, shortcut_in, stage), poetlab.Op(OpKind.COMPUTE, x, stage), poetlab.Op(OpKind.FREE, shortcut_in, stage)]
    last = max(k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and x in graph.nodes[op.node].inputs)
    ops = ops[:before] + recompute + ops[before : last + 1] + [poetlab.Op(OpKind.FREE, x, ops[last].stage)] + ops[last + 1 :]
    schedule = poetlab.Schedule(graph.n_nodes, tuple(ops))
    predicted = simulate(schedule, graph, costs)  # a valid schedule
    assert predicted.n_recomputes == 2
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    assert {late, index["grad:blocks_1_conv1"]} <= executor.layout.hooked
    executor.step(inputs, targets)  # (after it, pre-hooks only where the first step's had work: fewer)
    assert executor.plan.hook_at and executor.plan.hook_at < executor.layout.hooked
    _check_step("resnet", True, schedule, graph, costs, module, inputs, targets)  # (two steps: learnt hooks)


@pytest.mark.parametrize("name, fuse", [("mobilenet", True), ("bert", False)])
def test_last_frees_left_to_autograd_keep_gradients_and_memory(name, fuse, monkeypatch):
    """From the second step on, a node the step has no more use for (its own rerun, or a rerun that reads
    it, was the last) is handed over to autograd, and its last free is only counted (handovers_of): the
    pre-hooks that had only such frees to do go. Gradients stay autograd's, and the memory goes no later
    than where the reference step frees those nodes itself: its measured peak is no higher. Every node
    runs its first run with autograd's graph here: a graphless one (the encoder's) is nothing of the
    step's after its rerun, so nothing to hand over."""
    monkeypatch.setattr(execute_layout, "graphless_nodes", lambda layout: frozenset())
    module, inputs, targets, graph, costs = _traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, (0.6 if name == "mobilenet" else 0.95) * _full(graph, costs))
    loss_fn = nn.CrossEntropyLoss()
    handing = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn)
    freeing = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn, fast=False)
    rng = torch.get_rng_state()
    results = []
    for executor in (handing, freeing):
        results.append([])
        for _ in range(3):
            torch.set_rng_state(rng)  # (the encoder's dropout)
            executor.module.zero_grad(set_to_none=True)
            results[-1].append(executor.step(inputs, targets, measure_memory=True))
        assert all(torch.equal(a, b) for a, b in zip(_grads(handing.module), _grads(executor.module), strict=True))
    handed = {k for ks in handing.plan.handover.values() for k in ks}
    assert handed and handed <= handing.layout.handover_candidates.keys() and not freeing.plan.handover
    assert handing.plan.handed_frees == frozenset(handing.layout.handover_candidates[k][1] for k in handed)
    assert handing.plan.hook_at < freeing.plan.hook_at == handing.layout.hooked  # (hooks with only handed frees to do went)
    for learnt, reference in zip(results[0][1:], results[1][1:], strict=True):
        assert learnt.peak_bytes <= reference.peak_bytes and learnt.planned_peak_bytes == reference.planned_peak_bytes
    _check_step(name, fuse, schedule, graph, costs, module, inputs, targets)


@pytest.mark.parametrize("name, fuse", [("mobilenet", True), ("bert", False)])
def test_learnt_segments_hook_and_record_by_themselves(name, fuse):
    """Once the first step has shown that every packed node owns only storages of its own, and that the
    values of the nodes whose autograd nodes get pre-hooks are tensors, the segments' code does the
    reference loop's work itself (segments_of): a lean begin/finish pair around each managed node, nothing
    tracked by storage key, the autograd nodes to hook collected by the code (or the lean finish) and
    hooked after the run, frees called directly. The steps after it give the reference step's gradients,
    counts and planned peak (_check_step)."""
    module, inputs, targets, graph, costs = _traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, (0.6 if name == "mobilenet" else 0.95) * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    first = {n.target for s in executor.plan.segments.values() for n in s.run.__self__.graph.nodes if n.op == "call_method"}
    executor.step(inputs, targets)
    assert executor.plan.learnt and not executor.plan.tracking and executor.plan.hook_at <= executor.layout.hooked
    calls = {n.target for s in executor.plan.segments.values() for n in s.run.__self__.graph.nodes if n.op == "call_method"}
    # (a lean pair, or a lean finish alone for a node whose storages its code finds without the saved-tensor
    # hooks: MobileNetV2's Conv+BatchNorm+ReLU6 groups, not the encoder's layer, one module call)
    assert {"free", *(("finish_hookless",) if name == "mobilenet" else ("begin_owned", "finish_owned"))} <= calls
    assert not calls & {"begin", "finish_in_segment", "track", "hook_backward"}
    assert {"begin", "finish_in_segment"} <= first  # (the first step's code checks every node it packs)
    _check_step(name, fuse, schedule, graph, costs, module, inputs, targets)


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


@pytest.mark.parametrize("name, fuse", [("mobilenet", True), ("resnet", False)])
def test_the_forward_pass_runs_as_generated_functions(name, fuse):
    """Checkpoint-all changes nothing PyTorch would not do: its whole forward pass after the batch, the
    loss included, is one segment (one generated function), its backward pass one replay of bookkeeping,
    and the step is plain autograd's. A remat schedule's segments also run the first computes of the nodes it
    manages (and of their readers, under the saved-tensor hooks) and call into the step for its frees;
    the step is still autograd's, with every operation counted."""
    module, inputs, targets, graph, costs = _traced(name, fuse)
    loss_fn = nn.CrossEntropyLoss()
    full = checkpoint_all_schedule(graph)
    executor = ScheduleExecutor(copy.deepcopy(module), graph, full, loss_fn)
    forward = [op.node for op in full.ops if op.kind is OpKind.COMPUTE and not graph.nodes[op.node].is_backward]
    (segment,) = executor.plan.segments.values()
    code = segment.run.__self__
    # (the bookkeeping before the loss's call into the step is replayed by the code, the rest after it)
    replayed = [event for n in code.graph.nodes if n.op == "call_method" and n.target == "replay" for event in n.args[1]]
    assert [i for i, what in [*replayed, *segment.events] if what == COMPUTE] == [i for i in forward if graph.nodes[i].kind not in ("input", "loss")]
    assert [n.args[1] for n in code.graph.nodes if n.op == "call_method" and n.target == "compute_loss"] == [executor.binding.loss]
    first_backward = next(p for p, op in enumerate(full.ops) if op.kind is OpKind.COMPUTE and graph.nodes[op.node].is_backward)
    assert executor.plan.bookkeeping_end[first_backward] == len(full.ops)
    # the generated code calls the model's own modules (not copies: BatchNorm's statistics are the
    # model's), each one attribute of it away (fx's code walks the module path one getattr per part)
    called = [n.target for n in code.graph.nodes if n.op == "call_module"]
    assert called and all("." not in target for target in called)
    assert {id(m) for m in code.children()} <= {id(m) for m in executor.module.modules()}
    result = _check_step(name, fuse, full, graph, costs, module, inputs, targets)
    assert result.n_computes == len([op for op in full.ops if op.kind is OpKind.COMPUTE])
    remat = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, remat, loss_fn)
    assert len(executor.plan.segments) >= 1 and executor.layout.managed
    covered = {p for s in executor.plan.segments.values() for p in range(s.start, s.end)}
    assert {executor.layout.computed_at[i] for i in executor.layout.packed} <= covered
    result = _check_step(name, fuse, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0 and result.n_computes == len([op for op in remat.ops if op.kind is OpKind.COMPUTE])


@pytest.mark.parametrize("name, fuse", [("resnet", True), ("bert", False), ("mobilenet", True)])
def test_steps_after_the_first_own_what_a_checked_step_owns(name, fuse):
    """Once a step without prefetching has fetched nothing unplanned, the steps after it leave autograd's
    reads unchecked and find each managed node's storages where the first step did, by position
    (StepPlan.owned_sources). They must own, free, page and refill exactly what the reference step, which
    sorts every saved tensor out afresh, does: under a remat and a paging schedule the same counts, planned
    peak and bytes paged out and in (a page-out writes every storage the node owns) as the reference
    step's, and autograd's gradients (_check_step). Prefetching keeps the checks (reads wait)."""
    module, inputs, targets, graph, costs = _traced(name, fuse)
    loss_fn = nn.CrossEntropyLoss()
    fraction = 0.6 if name == "resnet" else 0.95
    schedule = greedy_remat_schedule(graph, costs, fraction * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn)
    executor.step(inputs, targets)
    assert executor.plan.unchecked_reads
    assert executor.plan.owned_sources and set(executor.plan.owned_sources) <= executor.layout.managed
    # the encoder's managed nodes own only storages of their own: its segments take the lean path
    # (StepRun.finish_owned); the ResNet's identity shortcuts return another node's memory, so it keeps tracking
    assert executor.plan.tracking == (name == "resnet")
    _check_step(name, fuse, schedule, graph, costs, module, inputs, targets)
    paging = greedy_paging_schedule(graph, costs, fraction * _full(graph, costs))
    assert _check_step(name, fuse, paging, graph, costs, module, inputs, targets).bytes_written > 0
    prefetching = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn, prefetch=True)
    prefetching.step(inputs, targets)
    assert prefetching.plan.learnt and not prefetching.plan.unchecked_reads and not prefetching.plan.owned_sources


def test_recomputes_of_the_batch_are_bookkeeping():
    """POET's MILP may free the batch and "recompute" it (it never leaves: the caller holds it). Such
    operations, in the forward pass or the backward pass, are counted and replayed with the bookkeeping:
    the forward pass stays one generated segment and no pre-hook is kept for them."""
    module, inputs, targets, graph, costs = _traced("resnet", True)
    ops = list(checkpoint_all_schedule(graph).ops)
    batch = next(i for i, node in enumerate(graph.nodes) if node.kind == "input")
    readers = [k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and batch in graph.nodes[op.node].inputs]
    first_backward = next(k for k, op in enumerate(ops) if graph.nodes[op.node].is_backward)

    def again(stage: int) -> list[poetlab.Op]:
        return [poetlab.Op(OpKind.FREE, batch, stage), poetlab.Op(OpKind.COMPUTE, batch, stage)]

    ops = (
        ops[: readers[0] + 1] + again(ops[readers[0]].stage)
        + ops[readers[0] + 1 : first_backward + 2] + again(ops[first_backward + 1].stage) + ops[first_backward + 2 :]
    )
    schedule = poetlab.Schedule(graph.n_nodes, tuple(ops))
    assert simulate(schedule, graph, costs).n_recomputes == 2
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    in_forward, in_backward = [k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.node == batch][1:]
    (segment,) = executor.plan.segments.values()
    assert segment.start < in_forward < segment.end
    assert executor.plan.events[in_backward] == (batch, RECOMPUTED_BATCH)
    result = executor.step(inputs, targets)
    assert result.n_recomputes == 2 and not executor.plan.hook_at
    _check_step("resnet", True, schedule, graph, costs, module, inputs, targets)


@pytest.mark.parametrize("name, fuse", [("resnet", False), ("resnet", True), ("mobilenet", True)])
def test_steps_that_recompute_leave_nothing_behind(name, fuse):
    """Two leaks once made every recompute schedule grow the process by megabytes a step (MobileNetV2
    x0.35 at batch 16, a POET schedule at half of checkpoint-all's peak: ~5 MiB a step): the autograd
    nodes a step hooked held their pre-hooks, which held the step's state, and a rerun's saved tensors
    were kept by autograd's own nodes (a node that saves its output, ReLU, held it while it held the
    node). Both are cycles through C++ that Python's collector cannot break. Every output of every module
    call of a step, first runs and reruns alike, must be gone once the step is, and so must its state."""
    module, inputs, targets, graph, costs = _traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    assert schedule is not None and schedule.n_recomputes > 0
    scheduled = copy.deepcopy(module)
    outputs: list[weakref.ref] = []
    for sub in scheduled.modules():
        if not list(sub.children()):
            sub.register_forward_hook(lambda _m, _i, out: outputs.append(weakref.ref(out)))
    with torch.no_grad():
        scheduled(inputs)
    plain_calls = len(outputs)
    runs = _alive_runs()
    executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
    executor.step(inputs, targets)
    first_step = len(outputs) - plain_calls
    assert first_step > plain_calls  # (the reruns called modules again)
    executor.step(inputs, targets)
    assert _alive_runs() == runs
    assert len(outputs) == plain_calls + 2 * first_step
    assert [k for k, ref in enumerate(outputs) if ref() is not None] == []


_FAULTS_PROBE = """
import resource, statistics, sys
import torch
import poetlab
from poetlab.torch.execute import ScheduleExecutor, retain_freed_memory
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.core.graph import TrainingGraph
from poetlab.torch.models import build_torch_model
torch.set_num_threads(1)
if sys.argv[1] == "retain":
    assert retain_freed_memory()
model = build_torch_model("mobilenetv2_torch", 2)
graph = TrainingGraph.load(sys.argv[2])  # (traced by the test: tracing here would move glibc's thresholds)
costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
schedule = greedy_remat_schedule(graph, costs, 0.5 * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes)
executor = ScheduleExecutor(model.module, graph, schedule, model.loss_fn)
faults = []
for _ in range(24):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    executor.step(model.inputs, model.targets)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults[6:]))  # (steps 7-24: the first steps grow the heap to the step's needs)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="retain_freed_memory tunes glibc's malloc")
def test_retained_memory_spares_a_recompute_schedule_its_page_faults(tmp_path):
    """glibc hands freed blocks of 128 KiB and more back to the kernel; a schedule that frees tensors
    mid-step (MobileNetV2 x0.35 at 128x128, greedy remat at half of checkpoint-all: 1.5 MB tensors) then
    page-faults fresh pages in on every step: a median of 1,400-4,300 per step over steps 7-24 (four fresh
    processes here). With retain_freed_memory() the blocks are reused: a median of 0, the odd step
    faulting a few hundred pages as the heap settles. (Before the executor stopped leaking, the leak grew
    the heap on most steps: medians of 12-100 here, 398 over steps 7-12 in one CI run; hence a median
    over 18 steps and a factor of 10.) Run in fresh interpreters: the setting is process-wide. The graph is
    traced here, not in the probes: tracing measures each operation's workspace, and freeing those large
    blocks raises glibc's dynamic mmap threshold, after which a default process faults no more either."""
    model = build_torch_model("mobilenetv2_torch", 2)
    trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True).save(tmp_path / "graph.json")
    env = {**os.environ, "PYTHONPATH": str(Path(poetlab.__file__).parents[1])}
    faults = {
        mode: float(subprocess.run([sys.executable, "-c", _FAULTS_PROBE, mode, str(tmp_path / "graph.json")], env=env, capture_output=True, text=True, check=True).stdout.split()[-1])
        for mode in ("default", "retain")
    }
    assert 10 * faults["retain"] < faults["default"], faults


def test_managed_nodes_found_without_hooks_run_without_them(monkeypatch):
    """A managed node whose storages the first step found among its fx values and what their autograd nodes
    saved (MobileNetV2's Conv+BatchNorm+ReLU6 groups: the convolution's and BatchNorm's outputs are fx
    values, BatchNorm's statistics its autograd node's ``_saved_result1``/``_saved_result2``) runs without
    the saved-tensor hooks from the second step on (StepRun.finish_hookless): the hooks are pushed only for
    the reruns. Autograd then checks the version of each tensor it saved, BatchNorm's running statistics
    among them, which the step writes again (reset, rerun: SyncBatchNorm here, which the reruns call as it
    is) to the bytes they were saved with: their versions are set back, and without that the backward pass
    fails."""
    module, inputs, targets = _case("mobilenet")
    module = _sync_norms(module)  # (BatchNorm's own classes rerun through a stand-in that writes nothing)
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.6 * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    executor.step(inputs, targets)
    assert executor.plan.hookless.keys() & executor.layout.rerun_in_backward
    assert {attr for places, _ in executor.plan.hookless.values() for _, attr in places} >= {None, "_saved_result1", "_saved_result2"}
    lean = {i for i in executor.plan.owned_places if i not in executor.plan.hookless}
    pushes: list[object] = []
    real_push = execute_state.push_saved_hooks
    _patch_function(monkeypatch, "push_saved_hooks", lambda *hooks: pushes.append(hooks) or real_push(*hooks))
    result = executor.step(inputs, targets)
    reruns = [op.node for p, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and executor.layout.computed_at[op.node] != p]
    assert len(pushes) == len([i for i in reruns if i not in executor.binding.inputs]) + len(lean)  # (the batch is never rerun)
    _patch_function(monkeypatch, "set_versions", lambda tensors, versions: None)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        executor.step(inputs, targets)
    monkeypatch.undo()
    _check_step("mobilenet", True, schedule, graph, costs, module, inputs, targets)


def test_nodes_only_recomputed_run_first_without_autograds_graph(monkeypatch):
    """A node the schedule recomputes once in the backward pass, and that only its own backward node reads
    there (``graphless_nodes``: the encoder's transformer layer here), runs its first run with grad off
    inside one autograd function (``GraphlessRun``), whose backward runs autograd on its rerun's graph:
    losses, gradients, buffers and the random numbers of three steps are a plain step's (``_check_step``),
    and the step's measured peak is lower than with that first run building its graph, as nothing of it is
    saved. Such nodes are none of the step's storages (not managed), and the same schedule run with every
    first run building its graph gives the same gradients."""
    module, inputs, targets, graph, costs = _traced("bert", False)
    schedule = greedy_remat_schedule(graph, costs, 0.95 * _full(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    assert executor.layout.graphless and not executor.layout.graphless & executor.layout.managed
    assert all(graph.nodes[i].kind == "TransformerEncoderLayer" for i in executor.layout.graphless)
    graphless = _check_step("bert", False, schedule, graph, costs, module, inputs, targets)
    monkeypatch.setattr(execute_layout, "graphless_nodes", lambda layout: frozenset())
    with_graph = _check_step("bert", False, schedule, graph, costs, module, inputs, targets)
    assert graphless.peak_bytes < with_graph.peak_bytes
    assert graphless.n_recomputes == with_graph.n_recomputes > 0


class _LinearAddLinear(nn.Module):
    """x -> a(x) + 1 -> b (sized so that the allocator's transients stay within the allowance): the add
    saves nothing, so only its own backward node could read a's output;
    ``tied`` makes b the same module as a (its weight read by two nodes)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.b = self.a if tied else nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + 1.0)


@pytest.mark.parametrize("tied", [False, True], ids=["own weights", "tied weights"])
def test_a_graphless_node_reading_only_the_batch_gets_its_gradients_and_tied_weights_keep_the_graph(tied):
    """The first Linear, freed after the add and recomputed just before its backward node: it reads only
    the caller's batch, which does not require grad, so its autograd function is recorded through the
    trigger input (without it the Linear's weight would get no gradient). A Linear whose weight another
    node reads too keeps its graph (the rerun's engine run would add up that weight's gradient in another
    order than a plain step): the same schedule then runs the usual way. Gradients equal a plain step's
    either way."""
    torch.manual_seed(0)
    module = _LinearAddLinear(tied).train()
    inputs = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    targets = torch.randint(256, (64,), generator=torch.Generator().manual_seed(3))
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    first, grad = index["a"], index["grad:a"]
    ops = list(checkpoint_all_schedule(graph).ops)
    assert any(op.kind is OpKind.FREE and op.node == first for op in ops[: next(k for k, op in enumerate(ops) if op.node == grad)])
    before = next(k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.node == grad)
    stage = ops[before].stage
    ops = ops[:before] + [poetlab.Op(OpKind.COMPUTE, first, stage)] + ops[before : before + 1] + [poetlab.Op(OpKind.FREE, first, stage)] + ops[before + 1 :]
    schedule = poetlab.Schedule(graph.n_nodes, tuple(ops))
    assert simulate(schedule, graph, costs).n_recomputes == 1  # (a valid schedule)
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    assert executor.layout.graphless == (frozenset() if tied else frozenset({first}))
    assert executor.layout.managed == (frozenset({first}) if tied else frozenset())
    if not tied:
        _check_step("linear", False, schedule, graph, costs, module, inputs, targets)
        return
    # (a tied weight's two gradient contributions are summed in a transient that the allowance, made for
    # the graph's tensors, does not cover: the peak is not compared here)
    reference = copy.deepcopy(module)
    for _ in range(2):
        nn.CrossEntropyLoss()(reference(inputs), targets).backward()
        executor.step(inputs, targets)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), executor.module.parameters(), strict=True))


@pytest.mark.parametrize("where", ["first run", "rerun"])
def test_a_step_failing_around_a_graphless_node_leaves_nothing_behind(where):
    """A graphless node's autograd function holds the node's state, which holds its first run's values
    until the schedule frees them and its rerun's graph until its backward: a cycle through C++ that
    Python's collector cannot break. A step that fails right after that first run, or in that rerun,
    leaves no output of the layer alive, no step state, and the caller's gradients as they were."""
    module, inputs, targets, graph, costs = _traced("bert", False)
    schedule = greedy_remat_schedule(graph, costs, 0.95 * _full(graph, costs))
    scheduled = copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
    (node,) = executor.layout.graphless
    executor.step(inputs, targets)  # (learnt: the first run is in a segment's code)
    grads = _grads(scheduled)
    layer = executor.modules[executor.binding.members[node][0].target]
    outputs: list[weakref.ref] = []
    calls = [0]

    def record(_m, _i, out):
        outputs.append(weakref.ref(out))
        calls[0] += 1
        if calls[0] == (1 if where == "first run" else 2):  # (the layer's first run, then its rerun)
            raise RuntimeError(f"failed {'after the first run' if where == 'first run' else 'in the rerun'}")

    layer.register_forward_hook(record)
    runs = _alive_runs()
    with pytest.raises(RuntimeError, match="failed (after the first run|in the rerun)"):
        executor.step(inputs, targets)
    assert outputs and [ref for ref in outputs if ref() is not None] == []
    assert _alive_runs() == runs
    assert all(torch.equal(a, b) for a, b in zip(grads, _grads(scheduled), strict=True))


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
    three steps give a plain step's gradients and counts (``_check_step``)."""
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
    given: dict[int, int] = {}  # a storage's real key -> the key it is given
    died: list[int] = []  # the keys of tracked storages that have died
    finishing: list[bool] = [False]

    def key(storage):
        real = real_key(storage)
        if real not in given:
            given[real] = died.pop() if died and finishing[0] else real
        return given[real]

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

    _patch_function(monkeypatch, "storage_key", key)
    monkeypatch.setattr(StepRun, "track_values", track)
    monkeypatch.setattr(StepRun, "finish", finish)
    _check_step("fork", False, schedule, graph, costs, module, inputs, targets)
    assert len(given) > len(set(given.values()))  # (a key was given twice: the emulation took place)

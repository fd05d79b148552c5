"""``poetlab.execute`` (one step, :mod:`poetlab.torch.execute.api`) and ``retain_freed_memory``: faults reported as one
clear error that change nothing, steps that leave nothing behind, the allocator's retained memory."""

from __future__ import annotations

import copy
import errno
import os
import platform
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.execute import ExecutionError, ScheduleExecutor, execute
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.torch.paging import PageStore, PagingError
from poetlab.core.schedule import OpKind, checkpoint_all_schedule
from poetlab.torch.models import ResNet18, build_torch_model

from execute_cases import trace, traced, alive_runs, grads_of, full_peak


pytestmark = pytest.mark.usefixtures("deterministic_torch")


def _paging_setup(with_grads: bool = True):
    module, inputs, targets, graph, costs = traced("resnet", True)
    schedule = greedy_paging_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    module = copy.deepcopy(module)
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.5) if with_grads else None
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    grads = grads_of(module)
    return module, inputs, targets, graph, schedule, before, grads


def _assert_untouched(module, before, grads, paging_root: Path):
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    for a, b in zip(grads_of(module), grads, strict=True):
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


def test_graph_of_another_module_is_refused():
    _, inputs, targets, graph, _ = traced("resnet", True)
    other = ResNet18(10, width=4)
    with pytest.raises(ExecutionError, match="trace"):
        execute(other, checkpoint_all_schedule(graph), (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss())


@pytest.mark.parametrize("name, fuse", [("resnet", False), ("resnet", True), ("mobilenet", True)])
def test_steps_that_recompute_leave_nothing_behind(name, fuse):
    """Two leaks once made every recompute schedule grow the process by megabytes a step (MobileNetV2
    x0.35 at batch 16, a POET schedule at half of checkpoint-all's peak: ~5 MiB a step): the autograd
    nodes a step hooked held their pre-hooks, which held the step's state, and a rerun's saved tensors
    were kept by autograd's own nodes (a node that saves its output, ReLU, held it while it held the
    node). Both are cycles through C++ that Python's collector cannot break. Every output of every module
    call of a step, first runs and reruns alike, must be gone once the step is, and so must its state."""
    module, inputs, targets, graph, costs = traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    assert schedule is not None and schedule.n_recomputes > 0
    scheduled = copy.deepcopy(module)
    outputs: list[weakref.ref] = []
    for sub in scheduled.modules():
        if not list(sub.children()):
            sub.register_forward_hook(lambda _m, _i, out: outputs.append(weakref.ref(out)))
    with torch.no_grad():
        scheduled(inputs)
    plain_calls = len(outputs)
    runs = alive_runs()
    executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
    executor.step(inputs, targets)
    first_step = len(outputs) - plain_calls
    assert first_step > plain_calls  # (the reruns called modules again)
    executor.step(inputs, targets)
    assert alive_runs() == runs
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

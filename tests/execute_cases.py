"""The executor's test cases, shared by the tests/test_execute*.py files: small models traced at test size, and
``check_step``, which runs a schedule beside plain autograd and beside the reference step (``fast=False``).

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
import gc
import importlib
import pkgutil
from dataclasses import replace

import torch
from torch import nn

import poetlab
import poetlab.torch.execute
from poetlab.torch.execute import ScheduleExecutor, memory_allowance_bytes
from poetlab.torch.execute import state as execute_state
from poetlab.torch.execute.step import StepRun
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.torch.models import MobileNetV2, ResNet18, build_torch_model
from poetlab.torch.trace import trace as _trace


def trace(*args, **kwargs):
    """``poetlab.torch.trace`` without the per-operation workspace: these tests check the executor against the
    simulator's count of the tensors (and plan at fractions of it), as written before the simulator counted
    workspace; a planned step's measured peak against its budget is tests/torch/test_user_models.py's."""
    graph = _trace(*args, **kwargs)
    return poetlab.TrainingGraph(graph.name, graph.nodes, {k: v for k, v in graph.metadata.items() if k != "workspace_by_node"})


def patch_function(monkeypatch, name: str, value: object) -> None:
    """Set the public function ``name`` of :mod:`poetlab.torch.execute.state` (the executor's one wrapper
    of a call of the pinned torch, or its storage keys) in every module of the executor that imports it."""
    original = getattr(execute_state, name)
    for info in pkgutil.iter_modules(poetlab.torch.execute.__path__):
        module = importlib.import_module(f"poetlab.torch.execute.{info.name}")
        if getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, value)


def model_case(name: str):
    """(module, inputs, targets) at test size, seeded."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "resnet":
        return ResNet18(10, width=8).train(), torch.randn(2, 3, 16, 16, generator=generator), torch.tensor([1, 7])
    if name == "mobilenet":
        return MobileNetV2(10, 0.35).train(), torch.randn(2, 3, 32, 32, generator=generator), torch.tensor([3, 4])
    model = build_torch_model("bert_small_torch", 2, seed=0)
    return model.module, model.inputs, model.targets


GRAPHS: dict[tuple[str, bool], tuple] = {}


def traced(name: str, fuse: bool, platform: str = "a72"):
    key = (name, fuse)
    if key not in GRAPHS:
        module, inputs, targets = model_case(name)
        GRAPHS[key] = (module, inputs, targets, trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=fuse))
    module, inputs, targets, graph = GRAPHS[key]
    return module, inputs, targets, graph, poetlab.CostModel.from_flops(graph, poetlab.load_platform(platform))


def alive_runs() -> int:
    """How many executed steps' states are alive, after a full collection."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is StepRun)


def grads_of(module: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


#: what a step of the executor's fast path must share with the reference step's (NOTE [8]; the loss too, on the
#: same random numbers)
SAME_AS_REFERENCE = (
    "n_computes", "n_recomputes", "n_pageouts", "n_pageins", "n_unplanned", "n_skipped_ops",
    "planned_peak_bytes", "bytes_written", "bytes_read", "n_compresses", "n_decompresses", "compressed_bytes",
)


def check_step(name, fuse, schedule, graph, costs, module, inputs, targets, **options):
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
            for (pname, _), a, b in zip(plain.named_parameters(), grads_of(plain), grads_of(model), strict=True):
                assert (a is None) == (b is None), pname
                assert a is None or torch.equal(a, b), f"{name}, step {step + 1}: gradient of {pname} differs"
            for a, b in zip(plain.buffers(), model.buffers(), strict=True):
                assert torch.equal(a, b)
        if step == 0:
            specification = results[1]
        result = results[0]
        assert [getattr(result, f) for f in SAME_AS_REFERENCE] == [getattr(specification, f) for f in SAME_AS_REFERENCE]
        check_counts(schedule, graph, module, result, predicted, costs)
    assert executor.plan.learnt and not reference.plan.learnt and not reference.plan.segments
    return replace(result, predicted=predicted)


def check_counts(schedule, graph, module, result, predicted, costs):
    assert result.n_unplanned == 0
    # every planned operation on a tensor of the step was carried out: no planner may page or recompute a
    # gradient of a traced graph (TrainingGraph.pinned); the caller's batch stays the caller's (its frees
    # and page-outs are left out and counted, a "recompute" of it is a no-op)
    batch = {i for i, node in enumerate(graph.nodes) if node.kind == "input"}
    assert result.n_recomputes == predicted.n_recomputes
    assert result.n_computes == schedule.count(OpKind.COMPUTE)
    assert result.n_pageouts == predicted.n_pageouts - sum(op.kind is OpKind.PAGE_OUT and op.node in batch for op in schedule.ops)
    assert result.n_skipped_ops == sum(op.kind in (OpKind.FREE, OpKind.PAGE_OUT, OpKind.PAGE_IN) and op.node in batch for op in schedule.ops)
    # (the executor plans the tensors; the simulator adds each computing node's workspace: graph.workspace)
    # (and counts each node whole to its free, where the simulator lets a left-alone node's output go before
    # what autograd saved inside it, as PyTorch does: TrainingGraph.early_release)
    whole = TrainingGraph(graph.name, graph.nodes, {**graph.metadata, "saved_internal_only": {}})
    planned = simulate(schedule, whole, costs) if graph.early_release else predicted
    tensors_peak = int(max((used - (int(graph.workspace[op.node]) if op.kind is OpKind.COMPUTE else 0) for used, op in zip(planned.memory_trace_bytes, schedule.ops, strict=True)), default=0))
    if predicted.n_compresses:  # compressed copies at their real size, the simulator's at a margined density
        assert result.planned_peak_bytes <= tensors_peak
    else:
        assert result.planned_peak_bytes == tensors_peak
    allowance = memory_allowance_bytes(module, graph)
    assert result.peak_bytes <= predicted.peak_ram_bytes + allowance, (result.peak_bytes, predicted.peak_ram_bytes, allowance)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    assert result.peak_bytes <= result.total_peak_bytes <= result.peak_bytes + param_bytes


def full_peak(graph, costs) -> int:
    """Checkpoint-all's simulated peak with each node counted whole to its free: the scale of these tests'
    budgets. (The simulator lets a left-alone node's output go before what autograd saved inside it,
    ``TrainingGraph.early_release``: on the small encoder that leaves 2% between checkpoint-all's peak and
    the largest single-node footprint, where these fractions were written for the whole count.)"""
    whole = TrainingGraph(graph.name, graph.nodes, {**graph.metadata, "saved_internal_only": {}})
    return simulate(checkpoint_all_schedule(whole), whole, costs).peak_ram_bytes


def sync_norms(module: nn.Module) -> nn.Module:
    """``module`` with its BatchNorm layers made ``nn.SyncBatchNorm`` (without a process group, BatchNorm's
    computation): a class the reruns call as it is (``RerunBatchNorm`` takes exactly BatchNorm1d/2d/3d), so
    that they update its running statistics a second time, as they would any module that writes its
    buffers in its forward pass: what ``RerunBuffers`` undoes."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(module)


class SharedNorm(nn.Module):
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


class LinearAddLinear(nn.Module):
    """x -> a(x) + 1 -> b (sized so that the allocator's transients stay within the allowance): the add
    saves nothing, so only its own backward node could read a's output;
    ``tied`` makes b the same module as a (its weight read by two nodes)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.b = self.a if tied else nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + 1.0)



def trains_as_plain_autograd(model, graph, schedule, budget: float, steps: int = 3, label: str = ""):
    """``steps`` steps of ``schedule`` on a copy of ``model`` (a ``load_user_model``/``build_torch_model``
    result), each beside a plain step from the same weights and RNG state on another copy: the same loss,
    gradients bit for bit, and a measured peak at or under ``budget``. Returns the last step's result."""
    reference, scheduled = copy.deepcopy(model.module), copy.deepcopy(model.module)
    executor = ScheduleExecutor(scheduled, graph, schedule, model.loss_fn)
    for step in range(steps):  # (the second step on runs as the first taught it)
        rng = torch.get_rng_state()
        plain = model.loss_fn(reference(model.inputs), model.targets)
        plain.backward()
        torch.set_rng_state(rng)
        result = executor.step(model.inputs, model.targets, measure_memory=True)
        assert result.loss == float(plain.detach())
        for (name, a), b in zip(reference.named_parameters(), scheduled.parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), name
            assert a.grad is None or torch.equal(a.grad, b.grad), f"{label}, step {step + 1}: gradient of {name} differs"
        assert result.peak_bytes <= budget, (label, step, result.peak_bytes, budget, graph.reserved_bytes)
    return result

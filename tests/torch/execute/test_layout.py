"""``StepLayout`` and ``StepPlan`` (:mod:`poetlab.torch.execute.layout`): which backward nodes are pre-hooked, and the
managed nodes a learnt step runs without the saved-tensor hooks."""

from __future__ import annotations

import copy

import pytest
from torch import nn

import poetlab
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.execute import state as execute_state
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate

from execute_cases import trace, patch_function, model_case, traced, check_step, full_peak, sync_norms


pytestmark = pytest.mark.usefixtures("deterministic_torch")


def test_recompute_before_a_group_without_its_own_autograd_node():
    """An identity shortcut has no autograd node of its own: its backward pre-hook lands on the node of
    the tensor it passes on and fires late. A recompute the schedule places just before that group's
    backward must still be done before autograd's next read: every later backward node is hooked on the
    first step, and from the second on those whose pre-hook then had work to do."""
    module, inputs, targets, graph, costs = traced("resnet", True)
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
    check_step("resnet", True, schedule, graph, costs, module, inputs, targets)  # (two steps: learnt hooks)


def test_managed_nodes_found_without_hooks_run_without_them(monkeypatch):
    """A managed node whose storages the first step found among its fx values and what their autograd nodes
    saved (MobileNetV2's Conv+BatchNorm+ReLU6 groups: the convolution's and BatchNorm's outputs are fx
    values, BatchNorm's statistics its autograd node's ``_saved_result1``/``_saved_result2``) runs without
    the saved-tensor hooks from the second step on (StepRun.finish_hookless): the hooks are pushed only for
    the reruns. Autograd then checks the version of each tensor it saved, BatchNorm's running statistics
    among them, which the step writes again (reset, rerun: SyncBatchNorm here, which the reruns call as it
    is) to the bytes they were saved with: their versions are set back, and without that the backward pass
    fails."""
    module, inputs, targets = model_case("mobilenet")
    module = sync_norms(module)  # (BatchNorm's own classes rerun through a stand-in that writes nothing)
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    executor.step(inputs, targets)
    assert executor.plan.hookless.keys() & executor.layout.rerun_in_backward
    assert {attr for places, _ in executor.plan.hookless.values() for _, attr in places} >= {None, "_saved_result1", "_saved_result2"}
    lean = {i for i in executor.plan.owned_places if i not in executor.plan.hookless}
    pushes: list[object] = []
    real_push = execute_state.push_saved_hooks
    patch_function(monkeypatch, "push_saved_hooks", lambda *hooks: pushes.append(hooks) or real_push(*hooks))
    result = executor.step(inputs, targets)
    reruns = [op.node for p, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and executor.layout.computed_at[op.node] != p]
    assert len(pushes) == len([i for i in reruns if i not in executor.binding.inputs]) + len(lean)  # (the batch is never rerun)
    patch_function(monkeypatch, "set_versions", lambda tensors, versions: None)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        executor.step(inputs, targets)
    monkeypatch.undo()
    check_step("mobilenet", True, schedule, graph, costs, module, inputs, targets)


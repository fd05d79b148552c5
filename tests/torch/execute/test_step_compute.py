"""Reruns of forward nodes (poetlab.torch.execute.step_compute, NOTE [3]): on the first run's RNG state
(dropout draws the same masks) and with BatchNorm's statistics as a plain step leaves them."""

from __future__ import annotations

import copy

import pytest

import poetlab
import torch
from poetlab.core.schedule import OpKind
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.execute.layout import node_buffers
from poetlab.torch.models import MobileNetV2
from torch import nn

from execute_cases import SharedNorm, check_step, full_peak, grads_of, sync_norms, trace, traced

pytestmark = pytest.mark.usefixtures("deterministic_torch")


def test_encoder_recompute_replays_dropout():
    """The encoder's transformer layers draw dropout masks: a recomputed layer must draw the same."""
    module, inputs, targets, graph, costs = traced("bert", False)
    remat = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    assert remat is not None
    computes = [graph.nodes[op.node].name for op in remat.ops if op.kind is OpKind.COMPUTE]
    assert any(name.startswith("layers") and computes.count(name) > 1 for name in computes)
    result = check_step("bert", False, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0


@pytest.mark.parametrize("norm", [nn.BatchNorm2d, nn.SyncBatchNorm], ids=["BatchNorm2d", "SyncBatchNorm"])
def test_a_rerun_leaves_a_shared_batchnorm_as_a_plain_step_does(norm):
    """A rerun in the backward pass of a node whose BatchNorm nodes that are not rerun update too: a
    BatchNorm runs through its stand-in, which writes none of its statistics (``RerunBatchNorm``); a
    SyncBatchNorm updates them a second time, and they are put back after the backward pass
    (ScheduleExecutor.rerun_buffers). Either way the running statistics are a plain step's."""
    torch.manual_seed(0)
    module, inputs, targets = SharedNorm(norm).train(), torch.randn(2, 3, 16, 16), torch.tensor([1, 2])
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.8 * full_peak(graph, costs))
    computes = [graph.nodes[op.node].name for op in schedule.ops if op.kind is OpKind.COMPUTE]
    assert "conv1" in computes[computes.index("grad:loss"):]  # (a rerun in the backward pass)
    check_step("shared norm", True, schedule, graph, costs, module, inputs, targets)


def test_reruns_reset_the_batchnorms_of_their_node_alone_and_keep_shared_ones():
    """Reruns of modules that write their buffers (SyncBatchNorm here, which the reruns call as it is): a
    node rerun once in the backward pass, whose module no other node uses, gets the buffers' values from
    the start of the step back before the backward pass, and its rerun updates them to the same bits as
    its first run did (one copy, no putting back: RerunBuffers); a module that other nodes update too is
    kept and put back. Either way the running statistics are a plain step's, step after step."""
    torch.manual_seed(0)
    cases = [("mobilenet", sync_norms(MobileNetV2(10, 0.35)).train(), torch.randn(2, 3, 32, 32), torch.tensor([3, 4]), 0.6, True),
             ("shared", SharedNorm(nn.SyncBatchNorm).train(), torch.randn(2, 3, 16, 16), torch.tensor([1, 2]), 0.8, False)]
    for name, module, inputs, targets, fraction, alone in cases:
        graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=True)
        costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
        schedule = greedy_remat_schedule(graph, costs, fraction * full_peak(graph, costs))
        reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
        executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
        assert executor.layout.rerun_in_backward, name
        for _ in range(4):
            rng = torch.get_rng_state()  # (MobileNetV2's dropout: the same masks on both sides)
            nn.CrossEntropyLoss()(reference(inputs), targets).backward()
            torch.set_rng_state(rng)
            executor.step(inputs, targets)
            for a, b in zip([*reference.buffers(), *grads_of(reference)], [*scheduled.buffers(), *grads_of(scheduled)], strict=True):
                assert torch.equal(a, b), name
        rerun = executor.rerun_buffers()
        assert rerun.buffers and (rerun.before_step is not None) == alone and executor.plan.unchecked_reads, name
        # (a node that saved a kept and put-back buffer keeps the saved-tensor hooks: ScheduleExecutor._without_hooks)
        kept = {id(b) for b in rerun.buffers} if not alone else set()
        assert not any(id(b) in kept for i in executor.plan.hookless for b in node_buffers(executor.layout, i)), name
        assert not alone or executor.plan.hookless.keys() & executor.layout.rerun_in_backward, name

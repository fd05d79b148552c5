"""The fast path (:mod:`poetlab.torch.execute.segments`): the forward pass as generated functions, the bookkeeping
replayed in runs, last frees handed over to autograd; each checked against the reference step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.execute import layout as execute_layout
from poetlab.torch.execute.segments import COMPUTE, RECOMPUTED_BATCH
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate

from execute_cases import traced, grads_of, check_step, full_peak


pytestmark = pytest.mark.usefixtures("deterministic_torch")


@pytest.mark.parametrize("name, fuse", [pytest.param("mobilenet", True, marks=pytest.mark.slow), ("bert", False)])  # (mobilenet: 18 s, slow)
def test_last_frees_left_to_autograd_keep_gradients_and_memory(name, fuse, monkeypatch):
    """From the second step on, a node the step has no more use for (its own rerun, or a rerun that reads
    it, was the last) is handed over to autograd, and its last free is only counted (handovers_of): the
    pre-hooks that had only such frees to do go. Gradients stay autograd's, and the memory goes no later
    than where the reference step frees those nodes itself: its measured peak is no higher. Every node
    runs its first run with autograd's graph here: a graphless one (the encoder's) is nothing of the
    step's after its rerun, so nothing to hand over."""
    monkeypatch.setattr(execute_layout, "graphless_nodes", lambda layout: frozenset())
    module, inputs, targets, graph, costs = traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, (0.6 if name == "mobilenet" else 0.95) * full_peak(graph, costs))
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
        assert all(torch.equal(a, b) for a, b in zip(grads_of(handing.module), grads_of(executor.module), strict=True))
    handed = {k for ks in handing.plan.handover.values() for k in ks}
    assert handed and handed <= handing.layout.handover_candidates.keys() and not freeing.plan.handover
    assert handing.plan.handed_frees == frozenset(handing.layout.handover_candidates[k][1] for k in handed)
    assert handing.plan.hook_at < freeing.plan.hook_at == handing.layout.hooked  # (hooks with only handed frees to do went)
    for learnt, reference in zip(results[0][1:], results[1][1:], strict=True):
        assert learnt.peak_bytes <= reference.peak_bytes and learnt.planned_peak_bytes == reference.planned_peak_bytes
    check_step(name, fuse, schedule, graph, costs, module, inputs, targets)


@pytest.mark.parametrize("name, fuse", [("mobilenet", True), ("bert", False)])
def test_learnt_segments_hook_and_record_by_themselves(name, fuse):
    """Once the first step has shown that every packed node owns only storages of its own, and that the
    values of the nodes whose autograd nodes get pre-hooks are tensors, the segments' code does the
    reference loop's work itself (segments_of): a lean begin/finish pair around each managed node, nothing
    tracked by storage key, the autograd nodes to hook collected by the code (or the lean finish) and
    hooked after the run, frees called directly. The steps after it give the reference step's gradients,
    counts and planned peak (check_step)."""
    module, inputs, targets, graph, costs = traced(name, fuse)
    schedule = greedy_remat_schedule(graph, costs, (0.6 if name == "mobilenet" else 0.95) * full_peak(graph, costs))
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
    check_step(name, fuse, schedule, graph, costs, module, inputs, targets)


@pytest.mark.parametrize("name, fuse", [("mobilenet", True), ("resnet", False)])
def test_the_forward_pass_runs_as_generated_functions(name, fuse):
    """Checkpoint-all changes nothing PyTorch would not do: its whole forward pass after the batch, the
    loss included, is one segment (one generated function), its backward pass one replay of bookkeeping,
    and the step is plain autograd's. A remat schedule's segments also run the first computes of the nodes it
    manages (and of their readers, under the saved-tensor hooks) and call into the step for its frees;
    the step is still autograd's, with every operation counted."""
    module, inputs, targets, graph, costs = traced(name, fuse)
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
    result = check_step(name, fuse, full, graph, costs, module, inputs, targets)
    assert result.n_computes == len([op for op in full.ops if op.kind is OpKind.COMPUTE])
    remat = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, remat, loss_fn)
    assert len(executor.plan.segments) >= 1 and executor.layout.managed
    covered = {p for s in executor.plan.segments.values() for p in range(s.start, s.end)}
    assert {executor.layout.computed_at[i] for i in executor.layout.packed} <= covered
    result = check_step(name, fuse, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0 and result.n_computes == len([op for op in remat.ops if op.kind is OpKind.COMPUTE])


def test_recomputes_of_the_batch_are_bookkeeping():
    """POET's MILP may free the batch and "recompute" it (it never leaves: the caller holds it). Such
    operations, in the forward pass or the backward pass, are counted and replayed with the bookkeeping:
    the forward pass stays one generated segment and no pre-hook is kept for them."""
    module, inputs, targets, graph, costs = traced("resnet", True)
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
    check_step("resnet", True, schedule, graph, costs, module, inputs, targets)


"""``ScheduleExecutor`` (:mod:`poetlab.torch.execute.executor`): schedules that recompute or page give plain
autograd's gradients step after step, as the reference step does; the learnt steps own what a checked step
owns; failures of a step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from poetlab.torch.execute import ExecutionError, ScheduleExecutor
from poetlab.torch.execute import executor as execute_executor
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.core.schedule import OpKind, checkpoint_all_schedule

from execute_cases import traced, grads_of, check_step, full_peak


pytestmark = pytest.mark.usefixtures("deterministic_torch")


@pytest.mark.parametrize("name, fuse", [("resnet", False), ("resnet", True), ("mobilenet", True)])
def test_remat_and_paging_schedules_give_autograds_gradients(name, fuse):
    module, inputs, targets, graph, costs = traced(name, fuse)
    full = full_peak(graph, costs)
    remat = greedy_remat_schedule(graph, costs, 0.6 * full)
    paging = greedy_paging_schedule(graph, costs, 0.6 * full)
    assert remat is not None and remat.n_recomputes > 0
    assert paging is not None and paging.count(OpKind.PAGE_OUT) > 0
    result = check_step(name, fuse, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0 and result.bytes_written == 0
    result = check_step(name, fuse, paging, graph, costs, module, inputs, targets)
    assert result.n_pageouts > 0 and result.bytes_written > 0 and result.bytes_read > 0
    assert result.peak_bytes < check_step(name, fuse, checkpoint_all_schedule(graph), graph, costs, module, inputs, targets).peak_bytes


@pytest.mark.parametrize("planner", [greedy_paging_schedule, greedy_remat_schedule])
def test_repeated_steps_with_one_executor_accumulate_like_backward(planner):
    """Gradients accumulate over steps as ``backward`` does. From the second step on, every parameter and
    buffer gets a new storage first (``p.data = ...``): after its first step the executor looks up only
    the storages of the constants its managed nodes met (ScheduleExecutor._learn), but on every step, so
    a new storage still counts as a constant, never as a managed node's to free."""
    module, inputs, targets, graph, costs = traced("resnet", True)
    schedule = planner(graph, costs, 0.6 * full_peak(graph, costs))
    loss_fn = nn.CrossEntropyLoss()
    reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, loss_fn)
    for step in range(3):
        if step:
            for tensor in [*scheduled.parameters(), *scheduled.buffers()]:
                tensor.data = tensor.data.clone()
        loss_fn(reference(inputs), targets).backward()
        executor.step(inputs, targets)
        for a, b in zip(grads_of(reference), grads_of(scheduled), strict=True):
            assert torch.equal(a, b)
        for tensor in [*scheduled.parameters(), *scheduled.buffers()]:
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    met = executor.plan.constants_met
    assert met is not None and 0 < len(met) < len(executor.constants)


def test_a_torch_without_the_private_calls_is_one_clear_error(monkeypatch):
    """The executor relies on calls of the pinned torch that are not public API (the saved-tensor hooks
    pushed without their context manager, UntypedStorage._swap_data_ptr_): another torch gets one clear
    error naming the fix when the executor is made, not an AttributeError in the middle of a step."""
    module, inputs, targets, graph, costs = traced("resnet", True)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    monkeypatch.setattr(execute_executor, "push_saved_hooks", None)
    with pytest.raises(ExecutionError, match="install the pinned torch"):
        ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())


@pytest.mark.parametrize("name, fuse", [("resnet", True), ("bert", False), ("mobilenet", True)])
def test_steps_after_the_first_own_what_a_checked_step_owns(name, fuse):
    """Once a step without prefetching has fetched nothing unplanned, the steps after it leave autograd's
    reads unchecked and find each managed node's storages where the first step did, by position
    (StepPlan.owned_sources). They must own, free, page and refill exactly what the reference step, which
    sorts every saved tensor out afresh, does: under a remat and (but for the encoder) a paging schedule the
    same counts, planned peak and bytes paged out and in (a page-out writes every storage the node owns) as
    the reference step's, and autograd's gradients (check_step). Prefetching keeps the checks (reads wait)."""
    module, inputs, targets, graph, costs = traced(name, fuse)
    loss_fn = nn.CrossEntropyLoss()
    fraction = 0.6 if name == "resnet" else 0.95
    schedule = greedy_remat_schedule(graph, costs, fraction * full_peak(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn)
    executor.step(inputs, targets)
    assert executor.plan.unchecked_reads
    assert executor.plan.owned_sources and set(executor.plan.owned_sources) <= executor.layout.managed
    # the encoder's managed nodes own only storages of their own: its segments take the lean path
    # (StepRun.finish_owned); the ResNet's identity shortcuts return another node's memory, so it keeps tracking
    assert executor.plan.tracking == (name == "resnet")
    check_step(name, fuse, schedule, graph, costs, module, inputs, targets)
    if name != "bert":  # (the greedy paging heuristic finds no schedule that pages the encoder at test size)
        paging = greedy_paging_schedule(graph, costs, fraction * full_peak(graph, costs))
        assert check_step(name, fuse, paging, graph, costs, module, inputs, targets).bytes_written > 0
    prefetching = ScheduleExecutor(copy.deepcopy(module), graph, schedule, loss_fn, prefetch=True)
    prefetching.step(inputs, targets)
    assert prefetching.plan.learnt and not prefetching.plan.unchecked_reads and not prefetching.plan.owned_sources

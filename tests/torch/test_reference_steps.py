"""The benchmarks' reference steps (:mod:`poetlab.torch.reference_steps`): ``HandStep``, beyond which the executor's
own time is measured, so its reruns must be the schedule's reruns, the random numbers that dropout drew in the
forward pass included; and ``CheckpointStep``, torch.utils.checkpoint doing the same reruns."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx

import poetlab
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.execute.codegen import bind_graph
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.torch.models import build_torch_model
from poetlab.torch.trace import trace
from poetlab.torch.reference_steps import CheckpointStep, HandStep
from execute_cases import full_peak


def test_the_hand_steps_reruns_replay_the_random_numbers_of_their_first_runs():
    """With the nodes that draw (the executor's ``draws_rng``) a rerun gives its first run's output bit for
    bit; without them it draws new numbers and does not (so the check can fail)."""
    model = build_torch_model("bert_small_torch", 2, seed=0)
    module = model.module.train()
    graph = trace(module, model.inputs, model.loss_fn, model.targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    executor = ScheduleExecutor(module, graph, schedule, model.loss_fn)
    executor.step(model.inputs, model.targets)
    drawing = {i for i, draws in executor.draws_rng.items() if draws}
    hand = HandStep(module, graph, schedule, model.loss_fn, rng_nodes=drawing)
    replayed = [i for i in hand.rng_nodes if executor.binding.members[i][-1].op == "call_module"]
    assert replayed, "the schedule reruns no node that draws random numbers"
    layer = module.get_submodule(str(executor.binding.members[replayed[0]][-1].target))
    for rng_nodes, same in ((drawing, True), (set(), False)):
        outputs: list[torch.Tensor] = []  # (its forward pass's, then its rerun's)
        handle = layer.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach().clone()))
        try:
            HandStep(module, graph, schedule, model.loss_fn, rng_nodes=rng_nodes).step(model.inputs, model.targets)
        finally:
            handle.remove()
        assert len(outputs) == 2 and torch.equal(outputs[0], outputs[1]) == same, rng_nodes


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_the_checkpoint_step_reruns_the_schedules_nodes_once_under_torch_utils_checkpoint(reentrant):
    """``CheckpointStep`` wraps each run of consecutive nodes the schedule recomputes in torch.utils.checkpoint:
    every module of those nodes, and no other, is called twice in a step (its forward pass and its rerun),
    and the gradients are a plain step's bit for bit (dropout's masks drawn again alike), with either of
    checkpoint's implementations (the reentrant one gets an input that requires grad, without which the
    runs reading only the batch would get no gradient at all). A schedule that pages, or reruns nothing,
    has no such step."""
    model = build_torch_model("bert_small_torch", 2, seed=0)
    module = model.module.train()
    graph = trace(module, model.inputs, model.loss_fn, model.targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    assert schedule is not None and schedule.n_recomputes > 0
    shared, reference = copy.deepcopy(module), copy.deepcopy(module)
    step = CheckpointStep.for_schedule(shared, graph, schedule, model.loss_fn, reentrant=reentrant)
    assert step is not None
    rerun = {i for i in schedule.recomputed_nodes() if graph.nodes[i].kind != "input"}
    assert sorted(i for run in step.runs for i in run) == sorted(rerun)
    members = bind_graph(graph, fx.symbolic_trace(shared)).members
    calls: dict[str, int] = {}  # (each module the trace calls: the encoder's layers are one call each)
    for i in range(graph.n_nodes):
        for m in members[i]:
            if m.op == "call_module":
                name = str(m.target)
                shared.get_submodule(name).register_forward_hook(lambda _m, _i, _o, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
    rng = torch.get_rng_state()
    model.loss_fn(reference(model.inputs), model.targets).backward()
    torch.set_rng_state(rng)
    step.step(model.inputs, model.targets)
    ours = {str(m.target) for i in rerun for m in members[i] if m.op == "call_module"}
    assert ours and {name for name, n in calls.items() if n == 2} == ours
    assert all(n == 1 for name, n in calls.items() if name not in ours)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), shared.parameters(), strict=True))
    assert CheckpointStep.for_schedule(shared, graph, checkpoint_all_schedule(graph), model.loss_fn, reentrant=reentrant) is None
    # (POET without remat: the greedy heuristic finds none that pages the encoder, a left-alone node's output
    # let go before its saved tensors leaving 2% between the largest footprint and checkpoint-all's peak)
    footprint = min_footprint_bytes(graph)[0]
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    paging = poetlab.solve(graph, costs, (footprint + peak) / 2 + graph.reserved_bytes, remat=False, time_limit_s=10).schedule
    assert paging is not None and any(op.kind is OpKind.PAGE_OUT for op in paging.ops)
    assert CheckpointStep.for_schedule(shared, graph, paging, model.loss_fn, reentrant=reentrant) is None

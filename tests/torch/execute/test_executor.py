"""``ScheduleExecutor`` (:mod:`poetlab.torch.execute.executor`): schedules that recompute, page, mix both or compress
give plain autograd's gradients step after step, as the reference step does; BatchNorm and dropout reruns;
failures inside a step."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.execute import ExecutionError, ScheduleExecutor
from poetlab.torch.execute import executor as execute_executor
from poetlab.torch.execute.layout import node_buffers
from poetlab.planners.baselines import capuchin
from poetlab.planners.baselines.base import Budgets
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.torch.models import MobileNetV2

from execute_cases import trace, traced, alive_runs, grads_of, check_step, full_peak, sync_norms, SharedNorm


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


def test_encoder_recompute_replays_dropout():
    """The encoder's transformer layers draw dropout masks: a recomputed layer must draw the same."""
    module, inputs, targets, graph, costs = traced("bert", False)
    remat = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    assert remat is not None
    computes = [graph.nodes[op.node].name for op in remat.ops if op.kind is OpKind.COMPUTE]
    assert any(name.startswith("layers") and computes.count(name) > 1 for name in computes)
    result = check_step("bert", False, remat, graph, costs, module, inputs, targets)
    assert result.n_recomputes > 0


def test_milp_schedule_and_a_schedule_mixing_recompute_and_paging():
    """POET's own schedule (m4 costs, 45% of checkpoint-all: it pages), and Capuchin's on a72 costs at 55%,
    which recomputes and pages in one step. (With a traced graph's gradients pinned, POET's MILP picks
    one lever or the other on this small model.)"""
    module, inputs, targets, graph, costs = traced("resnet", True, platform="m4")
    solved = poetlab.solve(graph, costs, 0.45 * full_peak(graph, costs) + graph.reserved_bytes, time_limit_s=10)  # (solve keeps these free)
    assert solved.schedule is not None and solved.n_pageouts > 0
    _, _, _, _, a72 = traced("resnet", True, platform="a72")
    mixed = capuchin.plan(graph, a72, Budgets(0.55 * full_peak(graph, a72), None))
    predicted = simulate(mixed, graph, a72)
    assert predicted.n_recomputes > 0 and predicted.n_pageouts > 0
    for schedule, schedule_costs in ((solved.schedule, costs), (mixed, a72)):
        for prefetch in (False, True):
            result = check_step("resnet", True, schedule, graph, schedule_costs, module, inputs, targets, prefetch=prefetch)
            batch_pageins = sum(op.kind is OpKind.PAGE_IN and graph.nodes[op.node].kind == "input" for op in schedule.ops)
            assert result.n_pageins == result.predicted.n_pageins - batch_pageins > 0 and result.prefetch is prefetch


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


def test_reruns_run_batchnorm_through_a_stand_in_that_leaves_its_statistics_alone():
    """A rerun calls each BatchNorm (exactly BatchNorm's classes, without hooks of its own) through a
    ``RerunBatchNorm``: in training, the same batch statistics, with running statistics of its own, so the
    module's are written once a step, by its first run; nothing is reset or put back (no rerun buffers).
    Gradients and buffers are a plain step's in training (a stand-in that wrote the module's statistics
    would leave them updated twice) and in eval mode (the module itself runs: it writes nothing). A
    BatchNorm with a forward hook is called as it is, its hook runs, and its buffers are reset again."""
    module, inputs, targets, graph, costs = traced("mobilenet", True)
    schedule = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    stand_ins = {t for code in executor.layout.rerun_code if code is not None for t in code.stand_ins}
    rerun = {m.target for i in executor.layout.rerun_in_backward for m in executor.binding.members[i] if m.op == "call_module"}
    assert stand_ins and stand_ins == {t for t in rerun if type(executor.modules[t]) is nn.BatchNorm2d}
    assert executor.layout.rerun_in_backward and not executor.rerun_buffers().buffers
    check_step("mobilenet", True, schedule, graph, costs, module, inputs, targets)
    check_step("mobilenet in eval mode", True, schedule, graph, costs, copy.deepcopy(module).eval(), inputs, targets)
    hooked, calls = copy.deepcopy(module), []
    target = sorted(stand_ins)[0]
    hooked.get_submodule(target).register_forward_hook(lambda *_: calls.append(target))
    executor = ScheduleExecutor(copy.deepcopy(hooked), graph, schedule, nn.CrossEntropyLoss())
    assert target not in {t for code in executor.layout.rerun_code if code is not None for t in code.stand_ins}
    assert {id(b) for b in executor.rerun_buffers().buffers} == {id(b) for b in executor.modules[target].buffers() if b.numel()}
    executor.step(inputs, targets)
    assert len(calls) == 2  # (the first run and the rerun)
    check_step("mobilenet, a hooked BatchNorm", True, schedule, graph, costs, hooked, inputs, targets)


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


def test_a_step_that_fails_inside_a_managed_node_leaves_no_hooks_behind():
    """A managed node's first run inside a generated segment has the saved-tensor hooks switched on
    around it. A module that raises there (on the second step, after the executor has learnt) must leave
    the hooks off, no step state alive, and the model as it was: the next step is plain autograd's."""
    module, inputs, targets, graph, costs = traced("mobilenet", True)
    loss_fn = nn.CrossEntropyLoss()
    remat = greedy_remat_schedule(graph, costs, 0.6 * full_peak(graph, costs))
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
    grads = grads_of(scheduled)
    runs = alive_runs()
    failing.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        executor.step(inputs, targets)
    del failing.forward
    assert alive_runs() == runs  # (the hooks, had they stayed on, would hold the step's state)
    for k, v in scheduled.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(torch.equal(a, b) for a, b in zip(grads_of(scheduled), grads, strict=True))
    step_both()
    assert all(torch.equal(a, b) for a, b in zip(grads_of(reference), grads_of(scheduled), strict=True))


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
    result = check_step("chain", False, schedule, graph, costs, module, inputs, targets)
    predicted = result.predicted
    assert result.n_compresses == predicted.n_compresses > 0
    assert result.n_decompresses == predicted.n_decompresses > 0
    assert 0 < result.compressed_bytes < result.n_compresses * int(graph.output_bytes.max())
    return result


def test_milp_schedule_with_compression_runs_compressed():
    """POET+compression's own schedule: the ReLU outputs it keeps compressed come back bit for bit."""
    module, inputs, targets, graph, costs, _ = _compression_case()
    solved = poetlab.solve(graph, costs, 0.9 * full_peak(graph, costs) + graph.reserved_bytes, 2.0, compression=True, time_limit_s=8)
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

    module, inputs, targets, graph, _ = traced("resnet", True, platform="m4")
    platform = poetlab.load_platform("m4")
    densities = graph_densities(module, inputs, nn.CrossEntropyLoss(), targets, graph)
    costs = poetlab.CostModel.from_flops(graph, platform).with_compression(compression_costs(graph, platform, densities))
    remat = greedy_remat_schedule(graph, costs, 0.8 * full_peak(graph, costs))
    assert remat is not None
    idle = compress_idle(remat, graph, costs.compression)
    before, after = simulate(remat, graph, costs), simulate(idle, graph, costs)
    assert after.peak_ram_bytes < before.peak_ram_bytes and after.n_compresses > 0
    assert after.energy_j == pytest.approx(before.energy_j + after.compression_energy_j)
    assert [op for op in idle.ops if op.kind is OpKind.COMPUTE] == [op for op in remat.ops if op.kind is OpKind.COMPUTE]
    _check_compressed_step(idle, graph, costs, module, inputs, targets)


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


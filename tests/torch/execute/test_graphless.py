"""Graphless first runs (:mod:`poetlab.torch.execute.graphless`, NOTE [6]): nodes only recomputed run first without
autograd's graph, with the gradients, buffers and random numbers of a plain step."""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.execute import layout as execute_layout
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate

from execute_cases import trace, traced, alive_runs, grads_of, check_step, full_peak, LinearAddLinear


pytestmark = pytest.mark.usefixtures("deterministic_torch")


def test_nodes_only_recomputed_run_first_without_autograds_graph(monkeypatch):
    """A node the schedule recomputes once in the backward pass, and that only its own backward node reads
    there (``graphless_nodes``: the encoder's transformer layer here), runs its first run with grad off
    inside one autograd function (``GraphlessRun``), whose backward runs autograd on its rerun's graph:
    losses, gradients, buffers and the random numbers of three steps are a plain step's (``check_step``),
    and the step's measured peak is lower than with that first run building its graph, as nothing of it is
    saved. Such nodes are none of the step's storages (not managed), and the same schedule run with every
    first run building its graph gives the same gradients."""
    module, inputs, targets, graph, costs = traced("bert", False)
    schedule = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    executor = ScheduleExecutor(copy.deepcopy(module), graph, schedule, nn.CrossEntropyLoss())
    assert executor.layout.graphless and not executor.layout.graphless & executor.layout.managed
    assert all(graph.nodes[i].kind == "TransformerEncoderLayer" for i in executor.layout.graphless)
    graphless = check_step("bert", False, schedule, graph, costs, module, inputs, targets)
    monkeypatch.setattr(execute_layout, "graphless_nodes", lambda layout: frozenset())
    with_graph = check_step("bert", False, schedule, graph, costs, module, inputs, targets)
    assert graphless.peak_bytes < with_graph.peak_bytes
    assert graphless.n_recomputes == with_graph.n_recomputes > 0


@pytest.mark.parametrize("tied", [False, True], ids=["own weights", "tied weights"])
def test_a_graphless_node_reading_only_the_batch_gets_its_gradients_and_tied_weights_keep_the_graph(tied):
    """The first Linear, freed after the add and recomputed just before its backward node: it reads only
    the caller's batch, which does not require grad, so its autograd function is recorded through the
    trigger input (without it the Linear's weight would get no gradient). A Linear whose weight another
    node reads too keeps its graph (the rerun's engine run would add up that weight's gradient in another
    order than a plain step): the same schedule then runs the usual way. Gradients equal a plain step's
    either way."""
    torch.manual_seed(0)
    module = LinearAddLinear(tied).train()
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
        check_step("linear", False, schedule, graph, costs, module, inputs, targets)
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
    module, inputs, targets, graph, costs = traced("bert", False)
    schedule = greedy_remat_schedule(graph, costs, 0.95 * full_peak(graph, costs))
    scheduled = copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
    (node,) = executor.layout.graphless
    executor.step(inputs, targets)  # (learnt: the first run is in a segment's code)
    grads = grads_of(scheduled)
    layer = executor.modules[executor.binding.members[node][0].target]
    outputs: list[weakref.ref] = []
    calls = [0]

    def record(_m, _i, out):
        outputs.append(weakref.ref(out))
        calls[0] += 1
        if calls[0] == (1 if where == "first run" else 2):  # (the layer's first run, then its rerun)
            raise RuntimeError(f"failed {'after the first run' if where == 'first run' else 'in the rerun'}")

    layer.register_forward_hook(record)
    runs = alive_runs()
    with pytest.raises(RuntimeError, match="failed (after the first run|in the rerun)"):
        executor.step(inputs, targets)
    assert outputs and [ref for ref in outputs if ref() is not None] == []
    assert alive_runs() == runs
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_of(scheduled), strict=True))


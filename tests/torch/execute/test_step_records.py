"""A step's storage records and autograd's saved-tensor hooks (poetlab.torch.execute.step_records): a failure
inside a managed node leaves no hooks and no step state behind."""

from __future__ import annotations

import copy

import pytest

import torch
import poetlab
from poetlab.core.schedule import Op, OpKind, Schedule, checkpoint_all_schedule, simulate
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.torch.execute import ScheduleExecutor
from torch import nn

from execute_cases import alive_runs, check_step, full_peak, grads_of, trace, traced

pytestmark = pytest.mark.usefixtures("deterministic_torch")


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


class _SplitMLP(nn.Module):
    """A tuple-valued node (``split``) between tensor-valued ones in one forward segment."""

    def __init__(self):
        super().__init__()
        self.a0, self.a, self.s = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 128)
        self.b, self.c, self.head = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        u, v = self.s(torch.tanh(self.a(torch.tanh(self.a0(x))))).split(64, dim=1)
        return self.head(torch.tanh(self.c(torch.tanh(self.b(u * v)))))


def _paged_in_before(graph, pairs: dict[str, str]) -> Schedule:
    """Checkpoint-all, with each forward node of ``pairs`` paged out after its last forward reader and paged
    in before the backward node it names: that node's pre-hook has work to do."""
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    order = [op.node for op in checkpoint_all_schedule(graph).ops if op.kind is OpKind.COMPUTE]
    after = {index[f]: max((j for j in graph.consumers[index[f]] if not graph.nodes[j].is_backward), key=order.index) for f in pairs}
    ops = []
    for op in checkpoint_all_schedule(graph).ops:
        if op.kind is OpKind.COMPUTE:
            ops += [Op(OpKind.PAGE_IN, index[f], op.stage) for f, b in pairs.items() if index[b] == op.node]
        ops.append(op)
        if op.kind is OpKind.COMPUTE:
            ops += [o for f, last in after.items() if last == op.node for o in (Op(OpKind.PAGE_OUT, f, op.stage), Op(OpKind.FREE, f, op.stage))]
    return Schedule(graph.n_nodes, tuple(ops))


def test_the_pre_hooks_after_a_tuple_valued_node_are_registered_on_learnt_steps():
    """On learnt steps, a segment's code collects its unmanaged nodes' autograd nodes into the step's list
    of pending pre-hooks, and a node whose values are not all tensors (``split``) registers its own at
    once: the list must stay the one the code appends to, or the pre-hooks collected after it (``tanh_1``'s
    here) are lost and the backward pass skips their page-ins (autograd reads an empty storage)."""
    torch.manual_seed(0)
    module, inputs, targets = _SplitMLP(), torch.randn(128, 64), torch.randint(4, (128,))
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = _paged_in_before(graph, {"tanh": "grad:s", "tanh_1": "grad:split", "mul": "grad:tanh_2"})
    simulate(schedule, graph, costs)  # (valid)
    result = check_step("split_mlp", False, schedule, graph, costs, module, inputs, targets)
    assert result.n_pageouts == 3

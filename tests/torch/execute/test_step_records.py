"""A step's storage records and autograd's saved-tensor hooks (poetlab.torch.execute.step_records): a failure
inside a managed node leaves no hooks and no step state behind."""

from __future__ import annotations

import copy

import pytest

import torch
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.torch.execute import ScheduleExecutor
from torch import nn

from execute_cases import alive_runs, full_peak, grads_of, traced

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

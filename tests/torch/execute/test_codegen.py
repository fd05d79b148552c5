"""Generated code for a step's groups (poetlab.torch.execute.codegen): a rerun calls BatchNorm through a
stand-in that leaves its statistics alone."""

from __future__ import annotations

import copy

import pytest

from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.torch.execute import ScheduleExecutor
from torch import nn

from execute_cases import check_step, full_peak, traced

pytestmark = pytest.mark.usefixtures("deterministic_torch")


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

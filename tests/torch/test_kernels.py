"""The memory model holds whichever kernels the CPU would pick (NOTE [kernel choice] in poetlab.torch.kernels).

oneDNN's AVX2 convolutions keep workspace the simulator cannot see (a plain step of the test ResNet held
1.65 MB against a predicted 0.27 MB). A child process is made to dispatch as an AVX2-only CPU does
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``; on such a CPU they change nothing), with oneDNN left on
as a caller leaves it: the executor's measured peak must stay within the simulator's plus the im2col
allowance, and so must a plain step taken inside :func:`poetlab.torch.kernels.planned_kernels`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from poetlab.torch.kernels import planned_kernels

_CHILD = """
import json, sys, torch
from torch import nn
import poetlab
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.execute import ScheduleExecutor, memory_allowance_bytes
from poetlab.torch.kernels import planned_kernels
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.models import MobileNetV2, ResNet18
from poetlab.torch.trace import trace

assert torch.backends.mkldnn.enabled  # (the caller's default: oneDNN on)
rows = []
for name, fuse in (("resnet", False), ("mobilenet", True)):
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "resnet":
        module, inputs, targets = ResNet18(10, width=8).train(), torch.randn(2, 3, 16, 16, generator=generator), torch.tensor([1, 7])
    else:
        module, inputs, targets = MobileNetV2(10, 0.35).train(), torch.randn(2, 3, 32, 32, generator=generator), torch.tensor([3, 4])
    loss_fn = nn.CrossEntropyLoss()
    graph = trace(module, inputs, loss_fn, targets, fuse=fuse)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = checkpoint_all_schedule(graph)
    executor = ScheduleExecutor(module, graph, schedule, loss_fn)
    executed = [executor.step(inputs, targets, measure_memory=True).peak_bytes for _ in range(2)]
    module.zero_grad(set_to_none=True)
    with measure_allocations() as plain, planned_kernels():
        loss_fn(module(inputs), targets).backward()
    rows.append({
        "name": name, "capability": torch.backends.cpu.get_cpu_capability(), "mkldnn_after": torch.backends.mkldnn.enabled,
        "predicted": simulate(schedule, graph, costs).peak_ram_bytes, "allowance": memory_allowance_bytes(module, graph),
        "executed": executed, "plain": plain.peak_excluding(p.grad.data_ptr() for p in module.parameters() if p.grad is not None),
    })
print(json.dumps(rows))
"""


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_peaks_stay_within_the_model_on_avx2_kernels_with_onednn_left_on():
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for row in rows:
        assert row["mkldnn_after"], row  # the executor put the caller's setting back
        bound = row["predicted"] + row["allowance"]
        assert all(peak <= bound for peak in row["executed"]), row
        assert row["plain"] <= bound, row


def test_planned_kernels_turn_onednn_off_and_put_the_setting_back():
    original = torch.backends.mkldnn.enabled
    for before in (True, False):
        torch.backends.mkldnn.enabled = before
        try:
            with planned_kernels():
                assert not torch.backends.mkldnn.enabled
            assert torch.backends.mkldnn.enabled is before
            with pytest.raises(RuntimeError), planned_kernels():
                raise RuntimeError("a failed step")
            assert torch.backends.mkldnn.enabled is before
        finally:
            torch.backends.mkldnn.enabled = original

"""The reference step (poetlab.torch.execute.step, NOTE [2]): one method per operation kind (free, page out
and in, recompute, compress); schedules that mix them give autograd's gradients; a read of what the
schedule does not hold is refused."""

from __future__ import annotations

import copy

import pytest

import poetlab
import torch
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.planners.baselines import capuchin
from poetlab.planners.baselines.base import Budgets
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.torch.execute import ExecutionError, execute
from torch import nn

from execute_cases import alive_runs, check_step, full_peak, trace, traced

pytestmark = pytest.mark.usefixtures("deterministic_torch")


def test_milp_schedule_and_a_schedule_mixing_recompute_and_paging():
    """POET's own schedule with paging only (m4 costs, 50% of checkpoint-all), and Capuchin's on a72
    costs at 55%, which recomputes and pages in one step. (With a traced graph's gradients pinned,
    POET's MILP picks one lever or the other on this small model; with both allowed, its better
    schedules recompute only, so the paging lever is asked for.)"""
    module, inputs, targets, graph, costs = traced("resnet", True, platform="m4")
    solved = poetlab.solve(graph, costs, 0.5 * full_peak(graph, costs) + graph.reserved_bytes, remat=False, time_limit_s=10)  # (solve keeps these free)
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


def test_a_schedule_that_drops_what_autograd_needs_is_refused():
    """Free a convolution group before the backward pass that reads it: strict refuses with one line;
    non-strict fetches it (a recompute) and counts it."""
    module, inputs, targets, graph, costs = traced("resnet", True)
    ops = list(checkpoint_all_schedule(graph).ops)
    conv = next(i for i, node in enumerate(graph.nodes) if node.kind.startswith("Conv2d"))
    first_backward = next(k for k, op in enumerate(ops) if graph.nodes[op.node].is_backward)
    ops = [op for op in ops if not (op.kind is OpKind.FREE and op.node == conv)]
    ops.insert(first_backward - 1, poetlab.Op(OpKind.FREE, conv, ops[first_backward - 1].stage))
    broken = poetlab.Schedule(graph.n_nodes, tuple(ops))
    runs = alive_runs()
    with pytest.raises(ExecutionError, match="does not hold"):
        execute(copy.deepcopy(module), broken, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), measure_memory=False)
    assert alive_runs() == runs  # (a step that failed midway in the backward pass leaves nothing behind)
    result = execute(copy.deepcopy(module), broken, (inputs, targets), graph=graph, loss_fn=nn.CrossEntropyLoss(), strict=False, measure_memory=False)
    assert result.n_unplanned > 0

"""Compression as a fourth choice: the simulator's new operations, the extended MILP against the
simulator, compression costs from densities, and the graph transformations."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform, solve
from poetlab.errors import InvalidArgumentError
from poetlab.milp import MilpOptions, build_milp
from poetlab.poet_solver import min_footprint_bytes
from poetlab.schedule import InvalidScheduleError, Op, OpKind, Schedule, checkpoint_all_schedule, simulate
from poetlab.techniques.bittrain import compressed_bytes
from poetlab.techniques.compression import compression_costs, densities_for_graph, measure_densities
from poetlab.techniques.transforms import saved_tensor_graph, sparse_update_graph

from small_graphs import convnet
from test_milp import _feasible


@pytest.fixture(scope="module")
def case():
    """A conv chain whose backward reads what autograd saves, on the Cortex-M4 (paging is dear there)."""
    graph = saved_tensor_graph(convnet(8, 8, 3))
    platform = load_platform("m4")
    densities = {i: 0.3 for i, node in enumerate(graph.nodes) if node.kind == "relu"}
    costs = CostModel.from_flops(graph, platform).with_compression(compression_costs(graph, platform, densities))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return graph, costs, int(footprint + 0.3 * (peak - footprint))


def test_compression_beats_poet_and_replays(case):
    graph, costs, budget = case
    poet = solve(graph, costs, budget, 2.0, mip_gap=0.0, time_limit_s=60)
    compressed = solve(graph, costs, budget, 2.0, compression=True, mip_gap=0.0, time_limit_s=120)
    assert poet.status == compressed.status == "optimal"
    assert compressed.energy_j < poet.energy_j * (1 - 1e-3)
    assert compressed.n_compresses > 0 and compressed.compression_energy_j > 0
    sim = simulate(compressed.schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=2.0 * costs.plain_step_runtime_s)
    assert sim.energy_j == pytest.approx(compressed.energy_j)
    assert sim.n_decompresses > 0
    # the formulation agrees with the simulator on the schedule: feasible, same objective
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=2.0, compression=True))
    x = model.encode(compressed.schedule.matrices().as_dict())
    ok, bad = _feasible(model, x)
    assert ok, f"rows violated: {bad[:5]}"
    assert model.c @ x == pytest.approx(sim.energy_j, rel=1e-9)
    # and the matrix view round-trips through the schedule builder
    rebuilt = Schedule.from_matrices(graph, **compressed.schedule.matrices().as_dict())
    assert simulate(rebuilt, graph, costs).energy_j == pytest.approx(sim.energy_j)


def test_compression_needs_costs(case):
    graph, costs, budget = case
    plain = costs.with_compression(None)
    with pytest.raises(InvalidArgumentError, match="compression costs"):
        solve(graph, plain, budget, compression=True)
    relu = next(i for i, node in enumerate(graph.nodes) if node.kind == "relu")
    ops = [Op(OpKind.COMPUTE, i, i) for i in range(relu + 1)] + [Op(OpKind.COMPRESS, relu, relu)]
    with pytest.raises(InvalidScheduleError, match="no compression costs"):
        simulate(Schedule(graph.n_nodes, tuple(ops)), graph, plain)


@pytest.mark.parametrize(
    "tail,reason",
    [
        ([Op(OpKind.DECOMPRESS, "relu", 9)], "no compressed copy"),
        ([Op(OpKind.FREE_COMPRESSED, "relu", 9)], "does not exist"),
        ([Op(OpKind.COMPRESS, "relu", 9), Op(OpKind.COMPRESS, "relu", 9)], "already compressed"),
        ([Op(OpKind.COMPRESS, "conv", 9)], "not allowed"),
    ],
)
def test_invalid_compression_ops(case, tail, reason):
    graph, costs, _ = case
    relu = next(i for i, node in enumerate(graph.nodes) if node.kind == "relu")
    index = {"relu": relu, "conv": relu - 1}
    ops = [Op(OpKind.COMPUTE, i, i) for i in range(relu + 1)] + [Op(op.kind, index[op.node], relu) for op in tail]
    with pytest.raises(InvalidScheduleError, match=reason):
        simulate(Schedule(graph.n_nodes, tuple(ops)), graph, costs)


def test_compress_then_decompress_by_hand(case):
    graph, costs, _ = case
    relu = next(i for i, node in enumerate(graph.nodes) if node.kind == "relu")
    c = int(costs.compression.compressed_bytes[relu])
    ops = [Op(OpKind.COMPUTE, i, i) for i in range(relu + 1)]
    ops += [Op(OpKind.COMPRESS, relu, relu), Op(OpKind.FREE, relu, relu), Op(OpKind.DECOMPRESS, relu, relu), Op(OpKind.FREE_COMPRESSED, relu, relu)]
    ops += [Op(OpKind.COMPUTE, i, i) for i in range(relu + 1, graph.n_nodes)]
    sim = simulate(Schedule(graph.n_nodes, tuple(ops)), graph, costs)
    b = int(graph.output_bytes[relu])
    trace = sim.memory_trace_bytes
    assert trace[relu + 1] - trace[relu] == c and trace[relu + 2] - trace[relu + 1] == -b
    assert sim.n_compresses == sim.n_decompresses == 1
    expected = costs.compression.compress_energy_j[relu] + costs.compression.decompress_energy_j[relu]
    assert sim.compression_energy_j == pytest.approx(expected)
    assert sim.energy_j == pytest.approx(costs.plain_step_energy_j + expected)


def test_compression_costs_from_densities():
    graph = build_paper_graph("vgg16_cifar")
    platform = load_platform("a72")
    relus = [i for i, node in enumerate(graph.nodes) if node.kind == "relu"]
    cc = compression_costs(graph, platform, {relus[0]: 0.4, relus[1]: 0.95}, margin=0.1)
    assert cc.allowed[relus[0]] and not cc.allowed[relus[1]]  # 0.95 * 1.1 is above break-even
    numel = graph.output_bytes[relus[0]] // 4
    assert cc.compressed_bytes[relus[0]] == compressed_bytes(numel, 0.44)
    assert cc.compress_energy_j[relus[0]] > 0 and cc.compress_energy_j[relus[1]] == 0
    with pytest.raises(InvalidArgumentError, match="density"):
        compression_costs(graph, platform, {relus[0]: 1.5})
    with pytest.raises(InvalidArgumentError, match="margin"):
        compression_costs(graph, platform, {}, margin=-1)


def test_densities_measured_on_the_torch_twin_map_one_to_one():
    from poetlab.torch_models import build_torch_model

    built = build_torch_model("vgg16_cifar_torch", 1, 0)
    measured = measure_densities(built.module, built.inputs)
    assert len(measured["relu"]) == 15 and len(measured["maxpool2d"]) == 5
    assert all(0.2 < d < 0.8 for d in measured["relu"])
    graph = build_paper_graph("vgg16_cifar")
    densities = densities_for_graph(graph, measured)
    relus = [i for i, node in enumerate(graph.nodes) if node.kind == "relu"]
    assert [densities[i] for i in relus] == measured["relu"]


def test_sparse_update_graph_drops_the_frozen_backward():
    graph = build_paper_graph("vgg16_cifar")
    frozen = sparse_update_graph(graph, 30)
    assert len(frozen.forward_indices) == len(graph.forward_indices)
    assert len(frozen.backward_indices) == len(graph.forward_indices) - 1 - 30
    platform = load_platform("a72")
    full_costs, sparse_costs = CostModel.from_flops(graph, platform), CostModel.from_flops(frozen, platform)
    assert sparse_costs.plain_step_energy_j < full_costs.plain_step_energy_j
    full_peak = simulate(checkpoint_all_schedule(graph), graph, full_costs).peak_ram_bytes
    assert simulate(checkpoint_all_schedule(frozen), frozen, sparse_costs).peak_ram_bytes < full_peak
    assert frozen.param_bytes < graph.param_bytes
    with pytest.raises(InvalidArgumentError, match="first trained"):
        sparse_update_graph(graph, 0)


def test_saved_tensor_graph_reads_what_autograd_saves():
    graph = saved_tensor_graph(convnet(4, 4, 2))
    by_name = {node.name: node for node in graph.nodes}
    # gradient of the pair (conv, relu): the ReLU saves its output; of (relu, conv): the conv its input
    conv_relu = by_name["bwd001_conv2d"]
    relu_conv = by_name["bwd002_relu"]
    assert conv_relu.inputs[0] == 2 and 1 not in conv_relu.inputs
    assert relu_conv.inputs[0] == 2 and 3 not in relu_conv.inputs
    assert np.array_equal(graph.output_bytes, convnet(4, 4, 2).output_bytes)


def test_frontier_table_and_figure(tmp_path):
    from poetlab.plotting import save_figure
    from poetlab.techniques.frontier import frontier_figure, frontier_table

    graph = saved_tensor_graph(convnet(8, 8, 3))
    platform = load_platform("m4")
    densities = {i: 0.3 for i, node in enumerate(graph.nodes) if node.kind == "relu"}
    costs = CostModel.from_flops(graph, platform)
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    budgets = [footprint + f * (peak - footprint) for f in (0.3, 1.0)]
    table = frontier_table(graph, platform, densities, budgets, first_trained=3, time_limit_s=30, mip_gap=0.0)
    assert set(table.method) == {"poet", "poet+compression", "sparse update"} and table.feasible.all()
    energy = table.set_index(["method", "ram_budget_bytes"]).energy_j
    assert energy["poet+compression", budgets[0]] < energy["poet", budgets[0]]
    assert energy["poet+compression", budgets[1]] == energy["poet", budgets[1]]  # checkpoint-all fits
    assert energy["sparse update", budgets[0]] < energy["poet", budgets[0]]
    path = save_figure(frontier_figure(table), tmp_path / "frontier.png")
    assert path.stat().st_size > 0

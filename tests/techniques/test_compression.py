"""Compression as a fourth choice: the simulator's new operations, the extended MILP against the
simulator, compression costs from densities measured on real models."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform, solve
from poetlab.errors import InvalidArgumentError
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import InvalidScheduleError, Op, OpKind, Schedule, checkpoint_all_schedule, simulate
from poetlab.techniques.bittrain import compressed_bytes
from poetlab.techniques.compression import (
    BitmapRates,
    compression_costs,
    densities_for_graph,
    graph_densities,
    measure_bitmap_rates,
    measure_densities,
)
from poetlab.techniques.transforms import saved_tensor_graph

from small_graphs import convnet
from milp_checks import feasible


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
    ok, bad = feasible(model, x)
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
    from poetlab.torch.models import build_torch_model

    built = build_torch_model("vgg16_cifar_torch", 1, 0)
    measured = measure_densities(built.module, built.inputs)
    assert len(measured["relu"]) == 15 and len(measured["maxpool2d"]) == 5
    assert all(0.2 < d < 0.8 for d in measured["relu"])
    graph = build_paper_graph("vgg16_cifar")
    densities = densities_for_graph(graph, measured)
    relus = [i for i, node in enumerate(graph.nodes) if node.kind == "relu"]
    assert [densities[i] for i in relus] == measured["relu"]


def _relu_densities(module, inputs):
    """Oracle: the density of every ReLU / max-pool output of one forward pass, by forward hooks, keyed
    by the fx name of the call (qualified module name with dots as underscores; each is called once)."""
    import torch
    from torch import nn

    found = {}

    def hook(name):
        def record(_module, _inputs, out) -> None:
            found[name.replace(".", "_")] = float(torch.count_nonzero(out)) / out.numel()

        return record

    hooks = [m.register_forward_hook(hook(name)) for name, m in module.named_modules() if isinstance(m, (nn.ReLU, nn.MaxPool2d))]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module(inputs)
    finally:
        for h in hooks:
            h.remove()
    return found


@pytest.mark.parametrize("fuse", [False, True])
def test_graph_densities_of_a_traced_model_node_by_node(fuse):
    """Densities land on the traced graph's own nodes by index: an unfused ReLU node gets its output's
    density, a fused Conv+ReLU node (VGG: the convolution's output is not saved) the ReLU's, a fused
    Conv+BatchNorm+ReLU node the mix of the dense convolution output it owns and the sparse ReLU output."""
    import torch
    from torch import nn

    from poetlab.torch.models import VGG16, ResNet18
    from poetlab.torch.trace import trace

    for module, inputs, targets in (
        (VGG16(10, 32, 64).train(), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([3])),
        (ResNet18(10, width=8).train(), torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2)), torch.tensor([1, 7])),
    ):
        graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=fuse)
        densities = graph_densities(module, inputs, nn.CrossEntropyLoss(), targets, graph)
        assert set(densities) == {i for i, n in enumerate(graph.nodes) if not n.is_backward and n.kind not in ("input", "loss")}
        oracle = _relu_densities(module, inputs)
        groups = graph.metadata["fx_groups"]
        ends = {i: oracle[groups[n.name][-1]] for i, n in enumerate(graph.nodes) if not n.is_backward and groups.get(n.name) and groups[n.name][-1] in oracle}
        assert len(ends) >= len(oracle) // 2  # (fused, a ReLU or max-pool followed by dropout or flatten ends there)
        for index, expected in ends.items():
            node = graph.nodes[index]
            if graph.metadata["internal_saved_bytes"][node.name] == 0:  # it owns its output only
                assert densities[index] == pytest.approx(expected, abs=1e-12), node.name
            else:  # it also owns what autograd saved inside it (a convolution output, max-pool indices)
                assert 0.0 < densities[index] < 1.0 and densities[index] != expected, node.name
        if fuse and isinstance(module, ResNet18):
            mixed = [i for i, n in enumerate(graph.nodes) if n.kind == "Conv2d+BatchNorm2d+ReLU"]
            assert mixed and all(0.6 < densities[i] < 0.9 for i in mixed)  # half of the bytes dense, half about 50%
        # the same module on another batch: other densities, same nodes
        other = graph_densities(module, inputs + 0.5, nn.CrossEntropyLoss(), targets, graph)
        assert set(other) == set(densities) and other != densities


def test_traced_graphs_are_refused_by_the_kind_mapping():
    import torch
    from torch import nn

    from poetlab.torch.models import VGG16
    from poetlab.torch.trace import trace

    module, inputs = VGG16(10, 32, 64).train(), torch.randn(1, 3, 32, 32)
    graph = trace(module, inputs, nn.CrossEntropyLoss(), torch.tensor([0]), fuse=True)
    with pytest.raises(InvalidArgumentError, match="graph_densities"):
        densities_for_graph(graph, measure_densities(module, inputs))
    with pytest.raises(InvalidArgumentError, match="not a traced graph"):
        graph_densities(module, inputs, nn.CrossEntropyLoss(), torch.tensor([0]), build_paper_graph("vgg16_cifar"))
    with pytest.raises(InvalidArgumentError, match="not traced from this module"):
        graph_densities(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)), inputs, nn.CrossEntropyLoss(), torch.tensor([0]), graph)


def test_measured_bitmap_rates_cost_compression_on_the_host():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates = measure_bitmap_rates(numel=1 << 14, densities=(0.2, 0.6), repeats=3)
    finally:
        torch.set_num_threads(threads)
    assert rates.threads == 1 and rates.clock == "cpu"
    assert all(0 < t < 1e-6 for t in (*rates.compress_s_per_element, *rates.decompress_s_per_element))
    graph = build_paper_graph("vgg16_cifar")
    platform = load_platform("a72")
    relu = next(i for i, node in enumerate(graph.nodes) if node.kind == "relu")
    fixed = BitmapRates((0.0, 1.0), (2e-9, 6e-9), (1e-9, 3e-9), 1 << 14, 1, "cpu")
    cc = compression_costs(graph, platform, {relu: 0.4}, margin=0.25, rates=fixed, power_w=5.0)
    numel = graph.output_bytes[relu] / 4
    assert cc.compress_time_s[relu] == pytest.approx(numel * 4e-9)  # at the margined density 0.5
    assert cc.decompress_time_s[relu] == pytest.approx(numel * 2e-9)
    assert cc.compress_energy_j[relu] == pytest.approx(5.0 * numel * 4e-9)
    assert cc.compress_time_s.sum() == cc.compress_time_s[relu]  # nothing else is allowed
    with pytest.raises(InvalidArgumentError, match="clock"):
        measure_bitmap_rates(clock="sundial")

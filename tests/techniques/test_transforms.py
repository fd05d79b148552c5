"""Sparse update as a graph transformation of a real model (:func:`poetlab.techniques.transforms.scheme_graph`).

Oracles: autograd's saved tensors counted by :func:`scheme_memory_bytes` (distinct storages, parameters
out), the allocator's peak while :func:`poetlab.torch.execute` runs the checkpoint-all schedule, and plain
``loss.backward()`` on the same scheme-applied module for gradients (bit for bit, deterministic
algorithms, one thread). Tolerances, and why:

- saved bytes: the graph may count more by the outputs of nodes that keep an internal tensor for
  backward (the trace keeps a node's output together with, e.g., dropout's mask: the one unit POET
  keeps, recomputes or pages), here at most the one 5 kB dropout output; otherwise the same storages.
- trained parameter bytes: exact (the graph charges only parameters that get a gradient).
- measured peak of checkpoint-all: within :func:`poetlab.torch.execute.memory_allowance_bytes` of the
  simulator's (one convolution's im2col workspace, which the graph does not model).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import poetlab
from poetlab.core.graph import TrainingGraph
import torch
from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.errors import InvalidArgumentError
from poetlab.techniques.sparse_update import SparseUpdateScheme, parse_scheme, scheme_memory_bytes, updatable_layers
from poetlab.techniques.transforms import saved_tensor_graph, scheme_graph, sparse_update_graph
from poetlab.torch.execute import execute, memory_allowance_bytes
from poetlab.torch.models import MobileNetV2
from torch import nn

from small_graphs import convnet

pytestmark = pytest.mark.usefixtures("deterministic_torch")

LOSS = nn.CrossEntropyLoss()


@pytest.fixture(scope="module")
def mbv2():
    torch.manual_seed(0)
    module = MobileNetV2(10, 0.35).train()
    return module, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([3])


class SmallCNN(nn.Module):
    """Five conv + BatchNorm + ReLU blocks of one size and a classifier: what the backward keeps
    outgrows the forward's working set, and POET solves it in seconds."""

    def __init__(self, width: int = 8, depth: int = 5):
        super().__init__()
        self.features = nn.Sequential(
            *(nn.Sequential(nn.Conv2d(3 if i == 0 else width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()) for i in range(depth))
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(width, 4)

    def forward(self, x):
        return self.classifier(self.flatten(self.pool(self.features(x))))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return SmallCNN().train(), torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2)), torch.tensor([1, 3])


def _ratios(module) -> dict[int, float]:
    """The classifier whole, and the last two dense convolutions at 1/2 and 1/4 of their channels."""
    layers = updatable_layers(module)
    dense = [i for i, (_, layer) in enumerate(layers) if isinstance(layer, nn.Conv2d) and layer.groups == 1]
    return {len(layers) - 1: 1.0, dense[-1]: 0.5, dense[-2]: 0.25}


def _schemes(module):
    n = len(updatable_layers(module))
    return {
        "bias-only": SparseUpdateScheme.bias_only(),
        "last-3": SparseUpdateScheme.last_k(n, 3),
        "ratios": SparseUpdateScheme.chosen(_ratios(module), min(_ratios(module)), "ratios"),
        "full": SparseUpdateScheme.full_update(),
    }


@pytest.mark.parametrize("which", ["bias-only", "last-3", "ratios", "full"])
def test_scheme_graph_memory_is_the_schemes_measured_memory(mbv2, which):
    module, x, y = mbv2
    scheme = _schemes(module)[which]
    sg = scheme_graph(module, scheme, x, LOSS, y)
    graph = sg.graph
    measured = scheme_memory_bytes(sg.module, x, which)
    # kept for backward in the graph: every forward node some backward node reads (the loss's own aside)
    by_name = {node.name: node for node in graph.nodes}
    read = {name for names in graph.metadata["saved_from"].values() for name in names} - {graph.metadata["loss_node"]}
    # (the batch, which a first convolution saves, is the caller's: its input node counts 0 in the graph)
    graph_saved = sum(by_name[name].output_bytes for name in read) + (x.numel() * x.element_size() if any(by_name[name].kind == "input" for name in read) else 0)
    # the trace keeps a node's output with the internal tensors autograd saves for it (dropout's mask):
    # where only the internal one is saved (a frozen classifier needs no dropout output), it counts both
    internal = graph.metadata["internal_saved_bytes"]
    slack = sum(graph.metadata["tensor_bytes"][name] for name in read if internal[name])
    assert measured.saved_activation_bytes <= graph_saved <= measured.saved_activation_bytes + slack
    assert slack <= graph.metadata["tensor_bytes"]["dropout"]  # the only such node in MobileNetV2
    assert graph.param_bytes == sg.trained_param_bytes == measured.gradient_bytes
    assert sg.frozen_param_bytes + sg.trained_param_bytes == sum(p.numel() * 4 for p in sg.module.parameters())
    # frozen layers upstream of the first trained one have no backward node
    n_backward = sum(node.is_backward for node in graph.nodes)
    n_forward = graph.n_nodes - n_backward
    assert (n_backward < n_forward - 1) is (which in ("last-3", "ratios"))
    # checkpoint-all as executed for real, against the simulator
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("m4"))
    schedule = checkpoint_all_schedule(graph)
    simulated = simulate(schedule, graph, costs)
    predicted = simulated.peak_ram_bytes
    result = execute(copy.deepcopy(sg.module), schedule, (x, y), graph=graph, loss_fn=LOSS)
    # (the executor plans the tensors, each node whole to its free; the simulator adds each computing node's
    # workspace, graph.workspace, and lets a left-alone node's output go before its saved tensors: early_release)
    workspace = [int(graph.workspace[op.node]) if op.kind.value == "compute" else 0 for op in schedule.ops]
    whole = TrainingGraph(graph.name, graph.nodes, {**graph.metadata, "saved_internal_only": {}})
    planned = simulate(schedule, whole, costs).memory_trace_bytes
    assert result.planned_peak_bytes == max(int(used) - w for used, w in zip(planned, workspace, strict=True))
    assert abs(result.peak_bytes - predicted) <= memory_allowance_bytes(sg.module, graph), (result.peak_bytes, predicted)


def test_sparse_schemes_shrink_the_graph_in_order(mbv2):
    module, x, y = mbv2
    schemes = _schemes(module)
    saved = {}
    for which in ("full", "bias-only", "last-3"):
        graph = scheme_graph(module, schemes[which], x, LOSS, y).graph
        by_name = {node.name: node for node in graph.nodes}
        saved[which] = sum(by_name[n].output_bytes for names in graph.metadata["saved_from"].values() for n in set(names))
    assert saved["full"] > saved["bias-only"] > saved["last-3"]


@pytest.mark.parametrize("which", ["bias-only", "ratios"])
def test_poet_schedule_on_the_scheme_graph_runs_with_autograds_gradients(cnn, which):
    torch.set_num_threads(1)
    module, x, y = cnn
    sg = scheme_graph(module, _schemes(module)[which], x, LOSS, y)
    graph = sg.graph
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("m4"))
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    assert footprint < full
    budget = footprint + 0.5 * (full - footprint) + graph.reserved_bytes  # (solve keeps these free)
    solved = poetlab.solve(graph, costs, budget, time_limit_s=10, threads=1, solver="highs")
    assert solved.schedule is not None and solved.peak_ram_bytes <= budget < full + graph.reserved_bytes
    assert solved.n_recomputes + solved.n_pageouts > 0
    rng = torch.get_rng_state()
    reference = copy.deepcopy(sg.module)
    plain = LOSS(reference(x), y)
    plain.backward()
    torch.set_rng_state(rng)
    scheduled = copy.deepcopy(sg.module)
    result = execute(scheduled, solved.schedule, (x, y), graph=graph, loss_fn=LOSS, costs=costs)
    assert result.loss == float(plain.detach()) and result.n_unplanned == 0
    for (name, a), b in zip(reference.named_parameters(), scheduled.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None) == (not a.requires_grad), name
        assert a.grad is None or torch.equal(a.grad, b.grad), name


def test_scheme_graph_refuses_what_is_not_a_scheme(cnn):
    module, x, y = cnn
    with pytest.raises(InvalidArgumentError, match="SparseUpdateScheme"):
        scheme_graph(module, "last-2", x, LOSS, y)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="unknown sparse-update scheme"):
        parse_scheme("first-2", module)
    traced = scheme_graph(module, SparseUpdateScheme.full_update(), x, LOSS, y).graph
    with pytest.raises(InvalidArgumentError, match="traced graph"):
        sparse_update_graph(traced, 3)  # the paper graphs' transform relies on the release's node pairs


def test_frontier_plans_sparse_update_on_the_schemes_graph():
    """The techniques frontier's sparse-update series: POET on the scheme graph of the same real chain
    that POET plans; its step is cheaper and smaller. Giving a paper-style frozen prefix too is refused."""
    from poetlab.reproduction.config import TechniquesFrontierConfig
    from poetlab.reproduction.techniques_frontier import conv_chain_graphs
    from poetlab.techniques.frontier import frontier_table

    config = TechniquesFrontierConfig(8, 8, 3, "m4", 0.3, 0.1, "last-2", (1.0,), 2.0, 5.0, 0.0, 1, "highs")
    graph, sparse = conv_chain_graphs(config)
    assert sparse.metadata["sparse_update_scheme"] == "last-2"
    assert sum(n.is_backward for n in sparse.nodes) < sum(n.is_backward for n in graph.nodes)
    assert 0 < sparse.param_bytes < graph.param_bytes
    platform = poetlab.load_platform("m4")
    costs = poetlab.CostModel.from_flops(graph, platform)
    budget = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes + graph.reserved_bytes  # (kept free by the planner)
    table = frontier_table(graph, platform, {}, [budget], sparse_graph=sparse, time_limit_s=5, threads=1, solver="highs").set_index("method")
    assert table.feasible.all()
    assert table.energy_j["sparse update"] < table.energy_j["poet"] and table.peak_ram_bytes["sparse update"] < table.peak_ram_bytes["poet"]
    with pytest.raises(InvalidArgumentError, match="not both"):
        frontier_table(graph, platform, {}, [budget], first_trained=3, sparse_graph=sparse)


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

"""The paper-faithful graphs and flop costs against the numbers read off the POET release."""

from __future__ import annotations

import math

import pytest

from poetlab import CostModel, PAPER_MODELS, build_paper_graph, load_platform
from poetlab.errors import InvalidArgumentError, UnknownNameError

# ../shared/reference/poet-cost-model.md, "Numbers to reproduce" (batch 1).
# The runtime column is printed with 6 significant digits; the release's exact value is the total flop
# count divided by FLOPS, and that flop count is pinned by the energy column (given to 16 digits).
REFERENCE = [
    # model, platform, T, edges, runtime_s (6 digits), forward RAM, plain-step energy, total flop, FLOPS
    ("linear", "m0", 27, 52, 1.58604, 6776, 0.10467864, 264340, 2000 / 0.012),
    ("resnet18_cifar", "a72", 133, 270, 0.158247, 2437712, 7.889510182705887, 316493950, 2 * 1000 * 1000 * 1000),
]


@pytest.mark.parametrize("model,platform,n_nodes,n_edges,runtime_s,forward_bytes,energy_j,total_flop,flops", REFERENCE)
def test_reference_numbers(model, platform, n_nodes, n_edges, runtime_s, forward_bytes, energy_j, total_flop, flops):
    graph = build_paper_graph(model, batch_size=1)
    costs = CostModel.from_flops(graph, load_platform(platform))
    assert graph.n_nodes == n_nodes
    assert graph.n_edges == n_edges
    assert graph.n_unique_edges == n_edges - 1  # the one duplicate: the first gradient reads the loss twice
    assert graph.forward_bytes == forward_bytes
    assert costs.plain_step_energy_j == pytest.approx(energy_j, rel=1e-12, abs=0)
    assert sum(node.flop for node in graph.nodes) == total_flop
    assert costs.plain_step_runtime_s == pytest.approx(total_flop / flops, rel=1e-9, abs=0)
    assert float(f"{costs.plain_step_runtime_s:.6g}") == runtime_s


def test_backward_is_the_release_chain():
    graph = build_paper_graph("resnet18_cifar")
    forward = graph.forward_indices
    backward = graph.backward_indices
    assert forward == tuple(range(67)) and backward == tuple(range(67, 133))
    loss = forward[-1]
    first = graph.nodes[backward[0]]
    assert first.inputs == (loss - 1, loss, loss)
    for k, index in enumerate(backward[1:], start=1):
        node = graph.nodes[index]
        earlier, later = loss - 1 - k, loss - k
        assert node.inputs == (earlier, later, index - 1)
        assert node.flop == 2 * graph.nodes[earlier].flop
        assert node.output_bytes == graph.nodes[later].output_bytes


@pytest.mark.parametrize("model", sorted(PAPER_MODELS))
def test_every_model_builds_in_topological_order(model):
    graph = build_paper_graph(model)
    n_forward = len(graph.forward_indices)
    assert graph.n_nodes == 2 * n_forward - 1
    for index, node in enumerate(graph.nodes):
        assert all(dep < index for dep in node.inputs)
        assert node.output_bytes == 4 * math.prod(node.output_shape)
    # the loss is the last forward node and is read by the first gradient node
    assert graph.nodes[n_forward - 1].kind == "cross_entropy"
    assert graph.nodes[n_forward].is_backward


def test_layer_formulas_on_known_shapes():
    resnet = build_paper_graph("resnet18")
    shapes = [node.output_shape for node in resnet.nodes if not node.is_backward]
    assert shapes[1] == (1, 64, 112, 112)  # conv 7x7/2 pad 3
    assert shapes[3] == (1, 64, 55, 55)  # max-pool 3x3/2 without padding, as released
    vgg = build_paper_graph("vgg16", batch_size=2)
    first_conv = vgg.nodes[1]
    assert first_conv.output_shape == (2, 64, 224, 224)
    assert first_conv.flop == 2 * 9 * (2 * 3 * 224 * 224) * 64 + 2 * 64 * 224 * 224
    assert first_conv.param_bytes == 4 * (64 * 3 * 9 + 64)
    bert = build_paper_graph("bert")
    assert bert.nodes[2].output_shape == (512, 512, 12)  # QK^T as the release calls it
    assert len([n for n in bert.nodes if n.kind == "qkv"]) == 12
    assert build_paper_graph("transformer").n_nodes == 19


def test_batch_size_scales_activations():
    one = build_paper_graph("resnet18_cifar", batch_size=1)
    four = build_paper_graph("resnet18_cifar", batch_size=4)
    # every forward tensor but the loss output (n_classes,) has the batch dimension
    for a, b in zip(one.nodes[:66], four.nodes[:66], strict=True):
        assert b.output_bytes == 4 * a.output_bytes
    assert four.param_bytes == one.param_bytes


def test_bad_model_and_batch():
    with pytest.raises(UnknownNameError, match="valid models: bert, bert_seq8, linear"):
        build_paper_graph("bogus")
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        build_paper_graph("linear", batch_size=0)
    with pytest.raises(InvalidArgumentError, match="batch size 1"):
        build_paper_graph("bert", batch_size=2)


@pytest.mark.parametrize("platform", ["m0", "m4", "a72", "a72nocache", "jetsontx2"])
def test_cost_model_formulas(platform):
    spec = load_platform(platform)
    graph = build_paper_graph("linear")
    costs = CostModel.from_flops(graph, spec)
    for i, node in enumerate(graph.nodes):
        assert costs.runtime_s[i] == node.flop / spec.flops_per_s
        assert costs.compute_energy_j[i] == node.flop / spec.flop_per_j
        pagein_s = spec.pagein_latency_s + node.output_bytes / spec.pagein_throughput_bytes_per_s
        pageout_s = spec.pageout_latency_s + node.output_bytes / spec.pageout_throughput_bytes_per_s
        assert costs.pagein_time_s[i] == pytest.approx(pagein_s, rel=1e-15)
        assert costs.pageout_time_s[i] == pytest.approx(pageout_s, rel=1e-15)
        assert costs.pagein_energy_j[i] == pytest.approx(pagein_s * spec.memory_power_w, rel=1e-15)
        assert costs.pageout_energy_j[i] == pytest.approx(pageout_s * spec.memory_power_w, rel=1e-15)
    assert costs.plain_step_energy_j > 0 and costs.plain_step_runtime_s > 0
    with pytest.raises(ValueError):
        costs.runtime_s[0] = 1.0  # read-only

"""The bytes of a traced step's gradients as autograd holds them (poetlab.torch.gradients): each gradient
storage once (a residual add hands one gradient to both its inputs), and a shared parameter's gradient
contributions where and while they live, checked on real traces and against a plain step's allocations."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poetlab
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.trace import trace

pytestmark = pytest.mark.usefixtures("deterministic_torch")


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.inner, self.head = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + torch.tanh(self.inner(h)))


class Twice(nn.Module):
    """One linear layer called twice, between two others: its weight and bias get two contributions each."""

    def __init__(self):
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.block(torch.tanh(self.block(self.stem(x))))))


def _node(graph, name: str):
    return next(node for node in graph.nodes if node.name == name)


def test_an_adds_gradient_is_one_storage_for_both_inputs():
    graph = trace(Residual(), torch.randn(32, 16), nn.CrossEntropyLoss(), torch.randint(4, (32,)))
    add = _node(graph, "add")
    assert len(add.inputs) == 2
    assert _node(graph, "grad:add").output_bytes == 32 * 64 * 4  # (counted by input: twice that)
    assert _node(graph, "grad:inner").output_bytes == 32 * 64 * 4  # (one input: as before)


def test_a_shared_parameters_contributions_live_from_its_first_backward_user_to_its_last():
    torch.manual_seed(0)
    module, inputs, targets = Twice(), torch.randn(32, 16), torch.randint(4, (32,))
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets)
    contribution = (64 * 64 + 64) * 4
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    first, last = index["grad:block_1"], index["grad:block"]  # (the second call's backward runs first)
    assert first < last and first in graph.nodes[last].inputs
    assert graph.nodes[first].output_bytes == 32 * 64 * 4 + contribution
    assert graph.metadata["workspace_by_node"]["grad:block"] >= contribution
    assert graph.metadata["shared_gradient_bytes"] == 0  # (not kept free for the whole step any more)
    assert graph.reserved_bytes == graph.metadata["rng_state_bytes"] + graph.metadata["loss_storage_bytes"]
    # a plain step's allocations against checkpoint-all's simulated peak: the same, but for the activation
    # gradient that grad:block_1 holds with its contribution (the graph's unit: one output per node), which
    # autograd frees once grad:tanh has read it; the whole-step reserve had both contributions beside the
    # forward pass too
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    predicted = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    plain = copy.deepcopy(module)
    with measure_allocations() as allocation:
        nn.CrossEntropyLoss()(plain(inputs), targets).backward()
    measured = allocation.peak_excluding(p.grad.data_ptr() for p in plain.parameters())
    assert measured <= predicted <= measured + 32 * 64 * 4, (predicted, measured)


class Tied(nn.Module):
    """A decoder reusing the encoder's weight transposed (``F.linear(h, self.encoder.weight.t())``)."""

    def __init__(self):
        super().__init__()
        self.features, self.encoder = nn.Linear(64, 64), nn.Linear(64, 16)

    def forward(self, x):
        h = torch.tanh(self.encoder(torch.tanh(self.features(x))))
        return nn.functional.linear(h, self.encoder.weight.t())


def test_a_weight_tied_through_its_transpose_contributes_the_gradient_its_reader_made():
    """The transpose's backward hands back a view of the gradient ``linear``'s backward made for it: that
    contribution is ``grad:linear``'s, held until the last user of the weight (``grad:encoder``) sums it,
    not a second tensor of ``grad:t``'s (it was counted twice)."""
    torch.manual_seed(0)
    module, inputs = Tied(), torch.randn(32, 64)
    targets = inputs.clone()
    graph = trace(module, inputs, nn.MSELoss(), targets)
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    contribution = 16 * 64 * 4
    assert graph.nodes[index["grad:t"]].output_bytes == 0
    assert graph.nodes[index["grad:linear"]].output_bytes == 32 * 16 * 4 + contribution
    assert index["grad:linear"] in graph.nodes[index["grad:encoder"]].inputs
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    predicted = simulate(checkpoint_all_schedule(graph), graph, costs, fixed_bytes=graph.metadata["loss_storage_bytes"]).peak_ram_bytes
    plain = copy.deepcopy(module)
    with measure_allocations() as allocation:
        nn.MSELoss()(plain(inputs), targets).backward()
    measured = allocation.peak_excluding(p.grad.data_ptr() for p in plain.parameters())
    # (grad:linear also holds h's gradient, which autograd frees once grad:tanh has read it: one output per node)
    assert measured <= predicted <= measured + 32 * 16 * 4, (predicted, measured)

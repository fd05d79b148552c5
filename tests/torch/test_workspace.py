"""Each operation's transient workspace, measured when a model is traced; the RNG states and the loss's
storage a step keeps beside its tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from poetlab.torch.trace import trace_step
from poetlab.torch.workspace import loss_storage_bytes, measure_workspaces, rng_reserve_bytes


class ConvNet(nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.conv, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.lin = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x):
        return self.lin(self.drop(self.relu(self.conv(x))).flatten(1))


class Twice(nn.Module):
    """One linear layer called twice: its weight and bias get two gradient contributions each."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(torch.relu(self.lin(x)))


def _traced(dropout: float = 0.0):
    torch.manual_seed(0)
    return trace_step(ConvNet(dropout), (torch.randn(2, 3, 16, 16),), nn.CrossEntropyLoss(), torch.randint(4, (2,)), fuse=False, name="convnet")


def test_a_convolutions_workspace_is_its_im2col_buffer():
    traced = _traced()
    graph = traced.graph
    found = measure_workspaces(traced)
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    assert set(found) == {i for i, node in enumerate(graph.nodes) if node.kind != "input"}  # inputs compute nothing
    im2col = 2 * (3 * 3 * 3) * (16 * 16) * 4  # batch x (channels x kernel area) x positions, float32: 9x the input
    assert found[index["conv"]] == found[index["grad:conv"]] == im2col
    assert found[index["relu"]] == found[index["flatten"]] == 0  # element-wise and views: nothing beyond their results
    assert all(value >= 0 for value in found.values())


@pytest.mark.parametrize("dropout,states", [(0.0, 2), (0.5, 3)])
def test_one_rng_state_per_drawing_node_and_two_more(dropout, states):
    before = torch.get_rng_state()
    assert rng_reserve_bytes(_traced(dropout)) == states * torch.get_rng_state().numel()
    assert torch.equal(before, torch.get_rng_state())  # the probes draw on a forked generator


def test_an_mse_loss_holds_its_unreduced_buffer():
    """MSELoss's value is a 0-d view of the batch-sized buffer it reduced: the loss holds that storage (a plain
    step's ``loss.backward()`` does, through the whole backward pass); cross-entropy's value is its own."""
    torch.manual_seed(0)
    mse = trace_step(Twice(), (torch.randn(2, 16),), nn.MSELoss(), torch.randn(2, 16), fuse=False, name="twice")
    loss = nn.MSELoss()(torch.randn(2, 16), torch.randn(2, 16))
    assert loss.untyped_storage().nbytes() == 2 * 16 * 4  # (what the measurement rests on)
    assert loss_storage_bytes(mse) == mse.graph.metadata["loss_storage_bytes"] == 2 * 16 * 4 - 4
    assert mse.graph.reserved_bytes >= loss_storage_bytes(mse)
    assert loss_storage_bytes(_traced()) == 0


def test_a_fused_groups_incoming_gradient_goes_once_its_first_operation_has_used_it_where_the_node_is_left_alone():
    """Conv+ReLU fused: in a real step autograd's engine frees the gradient the group receives once its ReLU's
    backward has used it, before the convolution's im2col buffer; the simulator holds that gradient (an
    output of the consumer's backward node) until the group's backward is done. So the group's workspace
    where the schedule leaves the group alone is the im2col buffer alone (``workspace_left_alone``); where it
    manages it (its storages kept until the schedule's free) the figure measured with that gradient held."""
    from poetlab.torch.workspace import measure_operations

    torch.manual_seed(0)
    traced = trace_step(ConvNet(), (torch.randn(2, 3, 16, 16),), nn.CrossEntropyLoss(), torch.randint(4, (2,)), fuse=True, name="convnet")
    graph = traced.graph
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    assert graph.metadata["fx_groups"]["conv"] == ["conv", "relu", "drop", "flatten"]
    measured = measure_operations(traced)
    im2col = 2 * (3 * 3 * 3) * (16 * 16) * 4
    assert measured.workspace_left_alone[index["grad:conv"]] == im2col < measured.workspace[index["grad:conv"]]
    assert graph.workspace_left_alone[index["grad:conv"]] == im2col and graph.workspace_owner[index["grad:conv"]] == index["conv"]
    assert graph.nodes[index["grad:lin"]].output_bytes == 2 * 8 * 16 * 16 * 4  # (the gradient it receives)

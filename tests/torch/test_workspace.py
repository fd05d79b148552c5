"""Each operation's transient workspace, measured when a model is traced; the RNG states and the loss's
storage a step keeps beside its tensors; the gradients each backward node returns, each storage once."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poetlab
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.kernels import planned_kernels
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
    # (the storage whole, and the 4-byte gradient loss.backward() seeds the engine with: both held to its end)
    assert loss_storage_bytes(mse) == mse.graph.metadata["loss_storage_bytes"] == 2 * 16 * 4 + 4
    assert mse.graph.reserved_bytes >= loss_storage_bytes(mse)
    assert loss_storage_bytes(_traced()) == 4 + 4


def test_a_fused_groups_incoming_gradient_and_saved_output_go_before_its_convolutions_im2col_where_the_node_is_left_alone():
    """Conv+ReLU fused: in a real step autograd's engine frees the gradient the group receives once its ReLU's
    backward has used it, and the ReLU's output (which only the ReLU saved, its readers' backwards being done)
    with the ReLU's backward, both before the convolution's im2col buffer; the simulator holds them (the
    consumer's backward output, the group's bytes) until the group's backward is done. So the group's
    workspace where the schedule leaves the group alone is the im2col buffer less that output
    (``workspace_left_alone``: the peak comes after they made room); where it manages it (its storages kept
    until the schedule's free) the figure measured with them held."""
    from poetlab.torch.workspace import measure_operations

    torch.manual_seed(0)
    traced = trace_step(ConvNet(), (torch.randn(2, 3, 16, 16),), nn.CrossEntropyLoss(), torch.randint(4, (2,)), fuse=True, name="convnet")
    graph = traced.graph
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    assert graph.metadata["fx_groups"]["conv"] == ["conv", "relu", "drop", "flatten"]
    measured = measure_operations(traced)
    im2col = 2 * (3 * 3 * 3) * (16 * 16) * 4
    output = 2 * 8 * 16 * 16 * 4
    assert measured.workspace_left_alone[index["grad:conv"]] == im2col - output < measured.workspace[index["grad:conv"]]
    assert graph.workspace_left_alone[index["grad:conv"]] == im2col - output and graph.workspace_owner[index["grad:conv"]] == index["conv"]
    assert graph.nodes[index["grad:lin"]].output_bytes == 2 * 8 * 16 * 16 * 4  # (the gradient it receives)


class Recurrent(nn.Module):
    """A GRU (one node) whose output and final state are both read: two ``getitem`` nodes of one tuple."""

    def __init__(self):
        super().__init__()
        self.gru, self.head = nn.GRU(24, 24, batch_first=True), nn.Linear(24, 3)

    def forward(self, x):
        out, h = self.gru(x)
        return self.head(out[:, -1] + h[0])


def _recurrent():
    torch.manual_seed(0)
    return trace_step(Recurrent(), (torch.randn(4, 10, 24),), nn.CrossEntropyLoss(), torch.randint(3, (4,)), fuse=False, name="gru")


def test_a_recurrent_cells_backward_workspace_holds_its_weight_gradients_sums_before_they_are_made_whole():
    """A GRU's backward makes a weight-gradient contribution per timestep and sums them as it goes; its input
    weights' gradient is made at the end, after the timesteps' peak. The workspace counts the bytes above
    what the backward leaves, parameter gradients left out from their allocation on (they live in ``.grad``,
    outside the budget), so checkpoint-all's simulated peak is at or above a plain step's measured one. (With the parameter gradients
    subtracted at the end instead, the workspace came out 96 bytes, and a step's simulated peak under a plain
    step's measured one.)"""
    traced = _recurrent()
    graph = traced.graph
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    found = measure_workspaces(traced)[index["grad:gru"]]
    assert found > traced.gm.gru.weight_hh_l0.nbytes  # (a timestep's hidden-weight contribution and their running sum)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    predicted = simulate(checkpoint_all_schedule(graph), graph, costs, fixed_bytes=graph.metadata["loss_storage_bytes"]).peak_ram_bytes
    module = copy.deepcopy(traced.gm)
    x, y = traced.record.values["x"], traced.targets
    with planned_kernels(), measure_allocations() as allocation:
        nn.CrossEntropyLoss()(module(x), y).backward()
    assert predicted >= allocation.peak_excluding(p.grad.data_ptr() for p in module.parameters())


def test_a_tuples_gradient_is_held_once_by_the_getitems_that_take_its_elements():
    """``out, h = gru(x)``, both read: the engine sums the two getitems' gradients into one per element, so their
    backward nodes hold out's gradient and h's once between them; an element no getitem takes would be
    zero-filled for the GRU's backward and count (each counted the whole tuple before: held twice)."""
    traced = _recurrent()
    graph = traced.graph
    taking = [node for node in graph.nodes if node.is_backward and graph.metadata["backward_of"][node.name] in ("getitem", "getitem_1")]
    out = 4 * 10 * 24 * 4
    state = 1 * 4 * 24 * 4
    assert len(taking) == 2 and sum(node.output_bytes for node in taking) == out + state

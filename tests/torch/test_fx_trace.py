"""The fx trace of a user's module with its shapes made concrete: eager-style shape code traces, the module
is left as it was, and untraceable code is one error naming every module and the way out."""

from __future__ import annotations

import math

import pytest
import torch
from torch import fx, nn

from poetlab.torch.fx_trace import TraceError, input_specs, symbolic_trace, traced_module


class ShapeCode(nn.Module):
    """Code written for eager PyTorch: a buffer sliced by a size, a square root of a size."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("mask", torch.tril(torch.ones(1, 16, 16)))

    def forward(self, x):
        B, T, C = x.size()
        scores = self.lin(x) @ x.transpose(1, 2) / math.sqrt(C)
        return scores.masked_fill(self.mask[:, :T, :T] == 0, 0.0) + torch.arange(T)


class Gate(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # data-dependent: fx cannot record it


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.gate = nn.Linear(4, 4), Gate()

    def forward(self, x):
        return self.gate(self.lin(x))


def test_input_specs_are_shapes_and_dtypes():
    assert input_specs([torch.zeros(2, 3), 5, torch.zeros(4, dtype=torch.int64)]) == [[[2, 3], "torch.float32"], None, [[4], "torch.int64"]]


def test_shape_code_traces_with_concrete_shapes_and_computes_the_same():
    torch.manual_seed(0)
    module, x = ShapeCode(), torch.randn(2, 5, 8)
    with pytest.raises(Exception):
        fx.symbolic_trace(module)  # plain fx: shapes are symbols
    before = set(module.__dict__)
    gm = symbolic_trace(module, specs=input_specs([x]))
    assert set(module.__dict__) == before  # fx's tensor constants went onto the GraphModule, off the module
    assert torch.equal(gm(x), module(x))
    assert not any(n.op == "call_method" and n.target == "size" for n in gm.graph.nodes)  # sizes are no graph nodes


def test_untraceable_code_names_the_module_and_the_way_out():
    module = Gated()
    with pytest.raises(TraceError) as info:
        symbolic_trace(module, specs=input_specs([torch.randn(3, 4)]))
    message = str(info.value)
    assert "\n" not in message and "module 'gate' (Gate)" in message and "leaf_modules=('gate',)" in message and "leaf_modules=(Gate,)" in message
    gm = symbolic_trace(module, leaf_modules=("gate",))
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["lin", "gate"]
    assert gm.meta["poetlab_user_leaves"] == ["gate"]


def test_the_executor_retraces_the_same_nodes():
    module, x = ShapeCode(), torch.randn(2, 5, 8)
    first = symbolic_trace(module, specs=input_specs([x]))
    again = traced_module(module, {"input_specs": input_specs([x]), "leaf_modules": []})
    assert [(n.op, n.name) for n in again.graph.nodes] == [(n.op, n.name) for n in first.graph.nodes]

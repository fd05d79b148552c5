"""Nodes of a traced step run alone on the values the trace recorded: the same output, the recorded values
left as they were (in-place nodes get copies), and their flops adding up to the whole step's."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from poetlab.torch.probes import in_place, node_flops, node_probe, tensors_in, whole_step_flops
from poetlab.torch.trace import trace_step


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.act, self.lin2 = nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 4)

    def forward(self, x):
        return self.lin2(self.act(self.lin1(x)))


def _traced():
    torch.manual_seed(0)
    return trace_step(Net(), (torch.randn(8, 16),), nn.CrossEntropyLoss(), torch.randint(4, (8,)), fuse=False, name="net")


def test_tensors_in_nested_values():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    assert [t.numel() for t in tensors_in((a, [b, {"k": c, "n": 3}], "x"))] == [1, 2, 3]
    assert tensors_in(None) == []


def test_in_place_writes_are_recognised():
    class Writes(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu, self.plain = nn.ReLU(inplace=True), nn.ReLU()

        def forward(self, x):
            return torch.relu_(self.plain(self.relu(x)).add_(1).add(1))

    gm = fx.symbolic_trace(Writes())
    modules = dict(gm.named_modules())
    found = {n.name: in_place(n, modules) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    assert found == {"relu": True, "plain": False, "add_": True, "add": False, "relu_": True}
    # an augmented assignment fx records as such (x += y on a traced value is recorded as operator.iadd in
    # graphs built by hand or by other tracers)
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    graph.output(graph.call_function(operator.iadd, (x, y)))
    assert [in_place(n, {}) for n in graph.nodes if n.op == "call_function"] == [True]


def test_a_probe_recomputes_the_recorded_output_and_leaves_the_record_alone():
    traced = _traced()
    index = {node.name: i for i, node in enumerate(traced.graph.nodes)}
    values = traced.record.values
    recorded = {name: value.clone() for name, value in values.items() if isinstance(value, torch.Tensor)}
    assert traced.graph.metadata["fx_groups"]["lin1"] == ["lin1", "act"]  # the in-place ReLU joins its producer's node
    for name, last in (("lin1", "act"), ("lin2", "lin2")):
        probe = node_probe(traced, index[name])
        out = probe.forward()
        assert torch.equal(out, values[last]) and not probe.is_backward
        probe.run_backward(out)  # (gradients w.r.t. its fresh inputs and its parameters: nothing recorded changes)
    assert all(torch.equal(values[name], value) for name, value in recorded.items())  # the in-place ReLU wrote a copy
    assert node_probe(traced, index["grad:lin1"]).is_backward


def test_node_flops_add_up_to_the_whole_step():
    traced = _traced()
    per_node = [node_flops(traced, i) for i in range(traced.graph.n_nodes)]
    index = {node.name: i for i, node in enumerate(traced.graph.nodes)}
    assert per_node[index["lin1"]][0] == 2 * 8 * 16 * 32  # a matmul: two flops per multiply-add
    assert per_node[index["grad:lin1"]] == (0, 0)  # a backward node's are its forward node's
    torch.manual_seed(0)
    whole = whole_step_flops(Net(), (torch.randn(8, 16),), nn.CrossEntropyLoss(), torch.randint(4, (8,)))
    assert whole == (sum(f for f, _ in per_node), sum(b for _, b in per_node))

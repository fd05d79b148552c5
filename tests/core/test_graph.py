"""TrainingGraph invariants and its JSON round trip."""

from __future__ import annotations

import json

import pytest

from poetlab import TrainingGraph, build_paper_graph
from poetlab.errors import GraphFileError, InvalidArgumentError, OutputError
from poetlab.core.graph import Node, cut_vertices
from poetlab.planners.baselines.chen import articulation_points

from small_graphs import convnet, relu_chain, residual


@pytest.mark.parametrize("model", ["linear", "resnet18_cifar", "transformer"])
def test_json_round_trip(tmp_path, model):
    graph = build_paper_graph(model, batch_size=1)
    path = graph.save(tmp_path / "sub" / f"{model}.json")
    loaded = TrainingGraph.load(path)
    assert loaded == graph
    assert loaded.metadata == graph.metadata
    assert loaded.to_json() == graph.to_json()
    assert not list(path.parent.glob(".*.tmp"))


def test_edges_and_consumers():
    graph = build_paper_graph("linear")
    assert graph.n_edges == 52 and len(graph.edges) == 51
    for producer, consumer in graph.edges:
        assert producer in graph.nodes[consumer].inputs
        assert consumer in graph.consumers[producer]
    assert graph.consumers[graph.n_nodes - 1] == ()


def _node(name, inputs, nbytes=4):
    return Node(name=name, kind="op", inputs=inputs, output_shape=(nbytes // 4,), output_bytes=nbytes, flop=1)


def test_invariants_are_enforced():
    with pytest.raises(InvalidArgumentError, match="topological order"):
        TrainingGraph("g", (_node("a", ()), _node("b", (2,)), _node("c", (0,))))
    with pytest.raises(InvalidArgumentError, match="duplicate node name"):
        TrainingGraph("g", (_node("a", ()), _node("a", (0,))))
    with pytest.raises(InvalidArgumentError, match="no nodes"):
        TrainingGraph("g", ())


def test_corrupt_graph_files(tmp_path):
    graph = build_paper_graph("linear")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text(graph.to_json()[:100])
    with pytest.raises(GraphFileError, match="bad.json: not valid JSON"):
        TrainingGraph.load(bad_json)
    data = graph.to_dict()
    data["nodes"][3]["inputs"] = [10]
    wrong_order = tmp_path / "order.json"
    wrong_order.write_text(json.dumps(data))
    with pytest.raises(GraphFileError, match="order.json: invalid training graph: .*topological order"):
        TrainingGraph.load(wrong_order)
    data = graph.to_dict()
    del data["nodes"][0]["output_bytes"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(data))
    with pytest.raises(GraphFileError, match="missing field 'output_bytes'"):
        TrainingGraph.load(missing)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(GraphFileError, match="not a poetlab training graph"):
        TrainingGraph.load(other)
    with pytest.raises(GraphFileError, match="cannot read"):
        TrainingGraph.load(tmp_path / "absent.json")


def test_unwritable_output_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputError, match="cannot write .*choose another path"):
        build_paper_graph("linear").save(blocker / "graph.json")



def test_output_bytes_least_is_an_output_less_what_early_release_lets_go():
    """A dropout holding 150 bytes, 100 of them its output tensor, which goes after its last tensor reader where
    the schedule leaves it alone (its backward reads the mask only): 50 at least. Without the trace's record
    (``metadata["saved_internal_only"]``), the full bytes."""
    nodes = (
        Node("x", "input", (), (1,), 0, 0.0), Node("a", "Linear", (0,), (1,), 100, 1.0), Node("d", "Dropout", (1,), (1,), 150, 1.0),
        Node("h", "Linear", (2,), (1,), 100, 1.0), Node("loss", "loss", (3,), (), 4, 1.0),
        Node("grad:loss", "backward", (4,), (), 4, 1.0, is_backward=True), Node("grad:h", "backward", (5, 2), (1,), 100, 1.0, is_backward=True),
        Node("grad:d", "backward", (6, 2), (1,), 100, 1.0, is_backward=True), Node("grad:a", "backward", (7, 0), (1,), 0, 1.0, is_backward=True),
    )
    graph = TrainingGraph("dropout_chain", nodes, {"tensor_bytes": {"d": 100}, "saved_internal_only": {"grad:d": ["d"]}})
    plain = TrainingGraph("dropout_chain", nodes, {})
    assert graph.output_bytes_least.tolist() == [0, 100, 50, 100, 4, 4, 100, 100, 0]
    assert plain.output_bytes_least.tolist() == plain.output_bytes.tolist()


def test_a_nodes_footprint_counts_the_workspace_left_alone_the_least_a_schedule_gets():
    """``min_footprint_bytes`` bounds every schedule from below (solve refuses a budget under it), so it counts a
    backward node's workspace where the schedule leaves its forward node alone (``workspace_left_alone``, below
    0 where its peak comes after its saved tensors made room), as checkpoint-all gets it: with the full figure
    it claimed more than checkpoint-all's simulated peak, and a budget checkpoint-all fits was refused."""
    import numpy as np

    from poetlab import CostModel, load_platform
    from poetlab.core.graph import min_footprint_bytes
    from poetlab.core.schedule import checkpoint_all_schedule, simulate

    plain = build_paper_graph("linear")
    b = next(i for i in plain.backward_indices if any(not plain.nodes[j].is_backward and plain.nodes[j].kind != "input" for j in plain.nodes[i].inputs))
    f = next(j for j in plain.nodes[b].inputs if not plain.nodes[j].is_backward)
    metadata = {
        **plain.metadata,
        "backward_of": {plain.nodes[b].name: plain.nodes[f].name},
        "workspace_by_node": {plain.nodes[b].name: 10 * int(plain.output_bytes.max())},
        "workspace_left_alone_by_node": {plain.nodes[b].name: -int(plain.output_bytes[f]) // 2},
    }
    graph = TrainingGraph(plain.name, plain.nodes, metadata)
    costs = CostModel.from_flops(graph, load_platform("a72"))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, node = min_footprint_bytes(graph)
    assert footprint <= peak
    sizes = graph.output_bytes
    assert footprint == max(int(sizes[i]) + int(graph.workspace_left_alone[i]) + sum(int(sizes[j]) for j in set(n.inputs)) for i, n in enumerate(graph.nodes))
    assert np.any(graph.workspace_left_alone < 0)


def _separates(graph, v) -> bool:
    """Whether every forward path from the first forward node to the last passes through ``v`` (by search)."""
    forward = graph.forward_indices
    first, last = forward[0], forward[-1]
    if v in (first, last):
        return True
    seen, stack = {first}, [first]
    while stack:
        u = stack.pop()
        for w in graph.consumers[u]:
            if w in forward and w != v and w not in seen:
                seen.add(w)
                stack.append(w)
    return last not in seen


@pytest.mark.parametrize("make", [lambda: build_paper_graph("bert"), lambda: build_paper_graph("resnet18_cifar"), residual, convnet, lambda: relu_chain(6)])
def test_cut_vertices_are_the_forward_tensors_every_path_passes(make):
    """The cut vertices are exactly the forward tensors whose removal separates the forward pass's first node from
    its last (checked by a search on the graph); on BERT, each layer's two skip-adds."""
    graph = make()
    cuts = cut_vertices(graph)
    assert cuts == [v for v in graph.forward_indices if _separates(graph, v)]
    # (and the articulation points no forward edge jumps over: revolve's chain states, as it computed them before)
    jumps = [(u, w) for u, w in graph.edges if w in graph.forward_indices]
    assert cuts == [p for p in articulation_points(graph) if not any(u < p < w for u, w in jumps)]
    if graph.n_nodes == build_paper_graph("bert").n_nodes:
        kinds = [graph.nodes[v].kind for v in cuts]
        assert kinds.count("skip_add") == 24

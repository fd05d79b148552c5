"""The one-line facts `poetlab graph` prints, each what the graph and its costs say."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.summary import GraphSummary, summarize_graph


@pytest.mark.parametrize("model,platform,batch", [("linear", "m0", 2), ("resnet18_cifar", "a72", 1)])
def test_the_summary_is_the_graphs_and_the_costs(model, platform, batch):
    graph = build_paper_graph(model, batch_size=batch)
    costs = CostModel.from_flops(graph, load_platform(platform))
    summary = summarize_graph(graph, costs)
    assert (summary.model, summary.platform, summary.batch_size) == (model, platform, batch)
    assert summary.n_nodes == graph.n_nodes == summary.n_forward + summary.n_backward
    assert summary.n_forward == len(graph.forward_indices) and summary.n_backward == len(graph.backward_indices)
    assert summary.n_unique_edges == graph.n_unique_edges <= summary.n_edges == graph.n_edges
    assert summary.total_runtime_s == pytest.approx(costs.runtime_s.sum())
    assert summary.plain_step_energy_j == pytest.approx(costs.compute_energy_j.sum())
    assert summary.forward_ram_bytes == graph.forward_bytes and summary.param_bytes == graph.param_bytes
    assert summary.peak_tensor_bytes == int(graph.output_bytes.max())
    assert GraphSummary(**summary.to_dict()) == summary


def test_a_graph_without_a_batch_size_says_none():
    graph = build_paper_graph("linear")
    unbatched = type(graph)(graph.name, graph.nodes)  # no metadata
    assert summarize_graph(unbatched, CostModel.from_flops(unbatched, load_platform("m0"))).batch_size is None

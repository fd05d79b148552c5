"""The techniques frontier stage on the smoke preset's conv chain: its two graphs, its rows at checkpoint-all's
budget (where nothing needs saving), and its metrics."""

from __future__ import annotations

import dataclasses

import pytest

from poetlab.reproduction.config import stage_config
from poetlab.reproduction.techniques_frontier import MODEL_NAME, conv_chain_graphs, techniques_metrics, techniques_rows

from repo_paths import REPO


@pytest.fixture(scope="module")
def config():
    return stage_config("techniques_frontier", "smoke", REPO / "params.yaml")


def test_the_sparse_graph_drops_the_frozen_backward(config):
    graph, sparse = conv_chain_graphs(config)
    assert graph.name == MODEL_NAME and sparse.name == f"{MODEL_NAME}+{config.sparse_scheme}"
    assert len(sparse.forward_indices) == len(graph.forward_indices)
    assert len(sparse.backward_indices) < len(graph.backward_indices)  # last-2: the frozen layers' backward is gone
    assert conv_chain_graphs(config) == (graph, sparse)  # seeded


def test_at_checkpoint_alls_budget_every_method_fits_and_metrics_say_so(config):
    table = techniques_rows(dataclasses.replace(config, fractions=(1.0,)))
    assert set(table.method) == {"poet", "poet+compression", "sparse update"} and table.feasible.all()
    assert (table.budget_fraction == 1.0).all() and (table.sparse_scheme == config.sparse_scheme).all()
    poet = table.set_index("method").energy_over_plain
    assert poet["poet"] == pytest.approx(1.0) and poet["poet+compression"] == pytest.approx(1.0)  # nothing to save at the peak
    assert poet["sparse update"] < 1.0  # the frozen backward is not computed
    metrics = techniques_metrics(table)
    assert metrics["model"] == MODEL_NAME and metrics["n_rows"] == 3
    assert all(metrics[method]["n_feasible"] == metrics[method]["n_budgets"] == 1 for method in ("poet", "poet+compression", "sparse update"))
    assert metrics["compression_never_worse"] and metrics["compression_max_saving"] == pytest.approx(0.0, abs=1e-9)

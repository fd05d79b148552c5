"""The pipeline's notebooks, executed for real with papermill on small parameters."""

from __future__ import annotations

import json

import pandas as pd
import papermill
import pytest

from conftest import REPO


def test_graphs_notebook_writes_table_and_metrics(tmp_path):
    params = {"graphs": {"models": ["linear", "resnet18_cifar"], "platforms": ["m0", "a72"], "batch_size": 1}, "output_dir": str(tmp_path)}
    papermill.execute_notebook(
        str(REPO / "notebooks" / "graphs.ipynb"),
        str(tmp_path / "graphs.ipynb"),
        parameters=params,
        kernel_name="python3",
        cwd=str(REPO),
        progress_bar=False,
    )
    table = pd.read_csv(tmp_path / "tables" / "graphs.csv")
    assert len(table) == 4
    row = table[(table.model == "linear") & (table.platform == "m0")].iloc[0]
    assert row.n_nodes == 27 and row.n_edges == 52 and row.forward_ram_bytes == 6776
    assert row.plain_step_energy_j == pytest.approx(0.10467864, rel=1e-11)
    metrics = json.loads((tmp_path / "metrics" / "graphs.json").read_text())
    assert metrics == {"n_rows": 4, "resnet18_cifar_a72_plain_step_energy_j": pytest.approx(7.889510182705887, rel=1e-12)}
    assert (tmp_path / "tables" / "graphs.md").read_text().startswith("| model")


def test_committed_outputs_match_params():
    """The committed table covers exactly the models and platforms params.yaml asks for."""
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())["graphs"]
    table = pd.read_csv(REPO / "experiments" / "tables" / "graphs.csv")
    assert sorted(set(table.model)) == sorted(params["models"])
    assert sorted(set(table.platform)) == sorted(params["platforms"])

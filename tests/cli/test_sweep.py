"""The `poetlab sweep` command: its one-line refusals, before anything is written."""

from __future__ import annotations

import pytest

from poetlab.cli import main


@pytest.fixture(autouse=True)
def _no_cluster_named(monkeypatch):
    monkeypatch.delenv("POETLAB_CLUSTER", raising=False)


def test_poetlab_sweep_refuses_a_stage_without_a_sweep_and_a_bad_address_in_one_line(tmp_path, capsys):
    assert main(["sweep", "claims", "--out", str(tmp_path)]) == 2
    assert main(["sweep", "fig4_runtime", "--preset", "smoke", "--cluster", "tcp://127.0.0.1", "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "poetlab: error: stage 'claims' has no sweep; sweep stages: baselines, fig3_frontier, fig4_runtime, fig5_capuchin, table3_pofo"
    assert lines[1].startswith("poetlab: error: --cluster: 'tcp://127.0.0.1' is not a Dask scheduler address; give tcp://HOST:PORT")
    assert len(lines) == 2 and not any(tmp_path.iterdir())  # nothing written

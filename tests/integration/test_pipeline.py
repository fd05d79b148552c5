"""The pipeline: its presets, and its notebooks executed for real with papermill on the smoke preset."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import papermill
import pytest
import yaml

from repo_paths import REPO
from poetlab.progress import PROGRESS_ENV
from poetlab.reproduction.params import stage_params

PARAMS = REPO / "params.yaml"


def run_notebook(name: str, tmp_path, preset: str = "smoke") -> None:
    papermill.execute_notebook(
        str(REPO / "notebooks" / f"{name}.ipynb"), str(tmp_path / f"{name}.ipynb"),
        parameters={"preset": preset, "params_file": str(PARAMS), "output_dir": str(tmp_path)},
        kernel_name="python3", cwd=str(REPO), progress_bar=False,
    )


def _progress_outputs(notebook) -> list[str]:
    """The outputs of an executed notebook that are progress bars: tqdm's text on stderr, or its widgets."""
    found = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
                found.append(str(output["data"].get("text/plain")))
            elif output.get("name") == "stderr" and ("%|" in "".join(output["text"]) or "IProgress" in "".join(output["text"])):
                found.append("".join(output["text"]))
    return found


def test_graphs_notebook_writes_table_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")  # as dvc.yaml runs it: the kernel inherits it, no bar is saved
    run_notebook("graphs", tmp_path)
    assert _progress_outputs(tmp_path / "graphs.ipynb") == []
    table = pd.read_csv(tmp_path / "tables" / "graphs.csv")
    assert len(table) == 4
    row = table[(table.model == "linear") & (table.platform == "m0")].iloc[0]
    assert row.n_nodes == 27 and row.n_edges == 52 and row.forward_ram_bytes == 6776
    assert row.plain_step_energy_j == pytest.approx(0.10467864, rel=1e-11)
    metrics = json.loads((tmp_path / "metrics" / "graphs.json").read_text())
    assert metrics == {"n_rows": 4, "resnet18_cifar_a72_plain_step_energy_j": pytest.approx(7.889510182705887, rel=1e-12)}
    assert (tmp_path / "tables" / "graphs.md").read_text().startswith("| model")


def test_baselines_notebook_writes_results_figures_and_metrics(tmp_path):
    run_notebook("baselines", tmp_path)
    smoke = stage_params("baselines", "smoke", PARAMS)
    table = pd.read_csv(tmp_path / "results" / "baselines.csv")
    assert len(table) == len(smoke["fractions"]) * len(smoke["methods"]) * len(smoke["cases"])
    metrics = json.loads((tmp_path / "metrics" / "baselines.json").read_text())
    poet = metrics["linear/m0"]["poet"]
    assert poet["n_feasible"] == len(smoke["fractions"])  # POET trains at every budget, down to the footprint
    assert metrics["linear/m0"]["checkpoint_all"]["n_feasible"] == 1  # only at its own peak
    assert metrics["methods_below_poet"] == []
    for suffix in ("png", "pdf"):
        assert (tmp_path / "figures" / f"baselines.{suffix}").stat().st_size > 1000


def test_committed_outputs_match_the_active_preset():
    graphs = stage_params("graphs", path=PARAMS)
    table = pd.read_csv(REPO / "experiments" / "tables" / "graphs.csv")
    assert sorted(set(table.model)) == sorted(graphs["models"])
    assert sorted(set(table.platform)) == sorted(graphs["platforms"])
    baselines = stage_params("baselines", path=PARAMS)
    table = pd.read_csv(REPO / "experiments" / "results" / "baselines.csv")
    assert sorted(set(zip(table.model, table.platform))) == sorted(tuple(case) for case in baselines["cases"])
    assert list(dict.fromkeys(table.method)) == baselines["methods"]
    assert sorted(set(table.budget_fraction)) == sorted(baselines["fractions"])


def _stale_stages(repo) -> set[str]:
    """The stages `dvc status` reports as changed (the frozen profiling stage is never reported)."""
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout or "{}"))


def test_changing_one_value_reruns_only_the_stages_that_read_it(tmp_path):
    """DVC's view of the pipeline: a value of one stage's preset section makes that stage stale and no
    other but the parameter check of every stage, whose unchanged stamp re-runs nothing (claims and
    report re-run after it only if its outputs change). Compared with the clone's own
    status before the edit, so a lock that is not current for other reasons does not change the verdict."""
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    before = _stale_stages(clone)
    params = yaml.safe_load((clone / "params.yaml").read_text())
    section = params["presets"][params["preset"]]["table3_pofo"]
    section["runtime_factor"] = float(section["runtime_factor"]) + 0.5
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert _stale_stages(clone) - before == {"table3_pofo", "params_check"} - before  # (the check reads every section)

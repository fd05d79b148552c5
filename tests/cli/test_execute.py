"""The `poetlab execute` command, run for real in a subprocess: a traced model planned and run beside plain
PyTorch."""

from __future__ import annotations

import json


def test_cli_execute_json(run_cli, tmp_path):
    done = run_cli("execute", "--model", "bert_small_torch", "--platform", "a72", "--ram-budget", "1e9", "--steps", "2", "--json", "--paging-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["identical"] is True and row["steps"] == 2 and row["measured_peak_bytes"] > 0
    assert row["solver_status"] == "optimal"


def test_cli_execute_refuses_paper_models_and_reports_infeasible(run_cli):
    done = run_cli("execute", "--model", "resnet18_cifar", "--platform", "a72", "--ram-budget", "1e6")
    assert done.returncode == 2 and "only traced torch models" in done.stderr and done.stderr.count("\n") == 1
    done = run_cli("execute", "--model", "bert_small_torch", "--platform", "a72", "--ram-budget", "1000")
    assert done.returncode == 1 and "infeasible" in done.stdout

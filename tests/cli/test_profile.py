"""The `poetlab profile` command and the profile flags of the others, run for real in a subprocess."""

from __future__ import annotations

import json

import pytest

from poetlab import CostModel, TrainingGraph, checkpoint_all_schedule, simulate
from poetlab.core.graph import min_footprint_bytes
from poetlab.torch.host_profile import HostProfile


@pytest.mark.slow
def test_cli_profile_then_solve_on_host(run_cli, tmp_path):
    out = tmp_path / "host.json"
    result = run_cli("profile", "--platform", "host", "--model", "bert_small_torch", "--paging-dir", str(tmp_path),
                     "--output", str(out), "--repeats", "1", "--warmup", "0", "--disk-repeats", "1")
    assert result.returncode == 0, result.stderr
    assert "step time" in result.stdout and "ratio" in result.stdout and "rerun in the backward pass" in result.stdout
    graph = run_cli("graph", "--model", "bert_small_torch", "--platform", "host", "--profile", str(out), "--json", "--output", str(tmp_path / "g.json"))
    assert graph.returncode == 0, graph.stderr
    summary = json.loads(graph.stdout)
    assert summary["platform"] == "host" and summary["n_nodes"] == 17
    training = TrainingGraph.load(tmp_path / "g.json")
    footprint, _ = min_footprint_bytes(training)
    plain_peak = simulate(checkpoint_all_schedule(training), training, CostModel.from_profile(training, HostProfile.load(out))).peak_ram_bytes
    assert footprint < plain_peak
    budget = str((footprint + plain_peak) // 2)  # below checkpoint-all: needs remat or paging
    solved = run_cli("solve", "--model", "bert_small_torch", "--platform", "host", "--profile", str(out),
                     "--ram-budget", budget, "--time-limit", "20", "--json")
    assert solved.returncode == 0, solved.stderr
    answer = json.loads(solved.stdout)
    assert answer["peak_ram_bytes"] <= int(budget) and answer["n_recomputes"] + answer["n_pageouts"] > 0


@pytest.mark.parametrize(
    "args,expected",
    [
        (("profile", "--platform", "a72"), "only the host platform can be profiled"),
        (("profile", "--paging-dir", "/nonexistent-dir"), "paging directory /nonexistent-dir does not exist"),
        (("profile", "--model", "resnet18_cifar"), "unknown torch model 'resnet18_cifar'"),
        (("graph", "--model", "linear", "--platform", "m0", "--fuse"), "--fuse applies to traced torch models"),
        (("solve", "--model", "bert_small_torch", "--platform", "host", "--profile", "/nonexistent.json", "--ram-budget", "1e6"), "no such host profile"),
    ],
)
def test_cli_errors_are_one_line(run_cli, args, expected):
    result = run_cli(*args)
    assert result.returncode == 2
    assert expected in result.stderr and result.stderr.count("\n") == 1

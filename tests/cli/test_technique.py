"""The technique commands and the solve flags for compression and sparse update, run for real."""

from __future__ import annotations

import json

import pytest


def test_solve_with_compression_from_measured_densities(run_cli):
    result = run_cli("solve", "--model", "vgg16_cifar", "--platform", "m4", "--ram-budget", "10000000", "--compress", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["status"] == "optimal" and out["n_compresses"] == 0  # checkpoint-all fits: nothing to compress


def test_solve_with_sparse_update_and_uniform_density(run_cli):
    args = ("solve", "--model", "linear", "--platform", "m0", "--ram-budget", "100000", "--json")
    full = json.loads(run_cli(*args).stdout)
    result = run_cli(*args, "--freeze-before", "5", "--compress", "--density", "0.3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["energy_j"] < full["energy_j"]


def test_compress_without_densities_is_one_line(run_cli):
    result = run_cli("solve", "--model", "linear", "--platform", "m0", "--ram-budget", "100000", "--compress")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--density" in result.stderr


@pytest.mark.slow
def test_technique_sparse_update(run_cli):
    result = run_cli("technique", "sparse-update", "--scheme", "last-2", "--inplace", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["inplace"] and 0 < out["backward_peak_bytes"] <= out["step_peak_bytes"]
    assert out["cost"]["total_bytes"] == out["cost"]["saved_activation_bytes"] + out["cost"]["gradient_bytes"]


def test_technique_bad_scheme_is_one_line(run_cli):
    bad = run_cli("technique", "sparse-update", "--scheme", "most")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "last-K" in bad.stderr


@pytest.mark.slow
def test_technique_bittrain(run_cli):
    result = run_cli("technique", "bittrain", "--batch-size", "2", "--relu-bias", "-1.0")
    assert result.returncode == 0, result.stderr
    assert "gradients identical" in result.stdout and "less" in result.stdout


def test_solve_with_a_real_sparse_update_scheme(run_cli):
    """``--sparse-update`` plans the traced graph of the scheme applied for real: only trained
    parameters are charged, and the step costs less than full update's."""
    from poetlab.techniques.sparse_update import apply_scheme, parse_scheme
    from poetlab.torch.models import build_torch_model

    args = ("solve", "--model", "mobilenetv2_torch", "--platform", "m4", "--ram-budget", "10000000", "--fuse", "--solver", "highs", "--threads", "1", "--time-limit", "5", "--json")
    out = {}
    for scheme in ("full", "last-2"):
        result = run_cli(*args, "--sparse-update", scheme)
        assert result.returncode == 0, result.stderr
        out[scheme] = json.loads(result.stdout)
    module = build_torch_model("mobilenetv2_torch").module
    for scheme in out:
        trained = sum(p.numel() * p.element_size() for p in apply_scheme(module, parse_scheme(scheme, module)).parameters() if p.requires_grad)
        assert out[scheme]["sparse_update"] == scheme and out[scheme]["trained_param_bytes"] == trained
    assert out["last-2"]["energy_j"] < out["full"]["energy_j"] and out["last-2"]["peak_ram_bytes"] < out["full"]["peak_ram_bytes"]


@pytest.mark.parametrize(
    "extra, says",
    [
        (("--model", "mobilenetv2_torch", "--sparse-update", "first-2"), "unknown sparse-update scheme 'first-2'"),
        (("--model", "mobilenetv2_torch", "--sparse-update", "last-999"), "k must be between 1 and the 53 layers"),
        (("--model", "mobilenetv2", "--sparse-update", "last-2"), "--sparse-update applies to traced torch models"),
    ],
)
def test_bad_sparse_update_is_one_line(run_cli, extra, says):
    result = run_cli("solve", "--platform", "m4", "--ram-budget", "1000000", *extra)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr

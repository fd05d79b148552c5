"""The `poetlab graph` command, run for real in a subprocess."""

from __future__ import annotations

import json

import pytest
import yaml

from poetlab import TrainingGraph, build_paper_graph

from repo_paths import PLATFORM_DIR


def test_graph_json_reproduces_reference(run_cli):
    result = run_cli("graph", "--model", "resnet18_cifar", "--platform", "a72", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["n_nodes"] == 133 and summary["n_edges"] == 270
    assert summary["forward_ram_bytes"] == 2437712
    assert summary["plain_step_energy_j"] == pytest.approx(7.889510182705887, rel=1e-12)
    assert summary["total_runtime_s"] == pytest.approx(316493950 / 2e9, rel=1e-9)
    assert summary["param_bytes"] == build_paper_graph("resnet18_cifar").param_bytes


def test_graph_text_and_output_file(run_cli, tmp_path):
    out = tmp_path / "g.json"
    result = run_cli("graph", "--model", "linear", "--platform", "m0", "--batch-size", "2", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "nodes" in result.stdout and "27 (14 forward, 13 backward)" in result.stdout
    assert TrainingGraph.load(out) == build_paper_graph("linear", batch_size=2)


@pytest.mark.parametrize(
    "args,expected",
    [
        (("--model", "bogus", "--platform", "a72"), "unknown model 'bogus'; valid models: bert, bert_base_torch, bert_seq8, bert_small_torch, linear, mobilenetv2_torch, resnet18, resnet18_cifar, resnet18_cifar_torch, resnet18_torch, resnet50, transformer, vgg16, vgg16_cifar, vgg16_cifar_torch, vgg16_torch"),
        (("--model", "linear", "--platform", "bogus"), "unknown platform 'bogus'; valid platforms: a72, a72nocache, jetsontx2, m0, m4"),
        (("--model", "linear", "--platform", "m0", "--batch-size", "-3"), "expected a positive integer"),
        (("--model", "bert", "--platform", "m0", "--batch-size", "2"), "use batch size 1"),
    ],
)
def test_bad_names_give_one_line_and_exit_2(run_cli, args, expected):
    result = run_cli("graph", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0]
    assert "Traceback" not in result.stderr


def test_corrupt_platform_yaml(run_cli, tmp_path):
    spec = yaml.safe_load((PLATFORM_DIR / "m4.yaml").read_text())
    spec["coefficients"]["flops_per_s"]["value"] = -5
    (tmp_path / "m4.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "garbled.yaml").write_text("name: garbled\n  coefficients: : :\n")
    for name, problem in [("m4", "coefficients.flops_per_s.value' must be a positive"), ("garbled", "invalid YAML")]:
        result = run_cli("graph", "--model", "linear", "--platform", name, "--platform-dir", str(tmp_path))
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{name}.yaml" in lines[0] and problem in lines[0]


def test_cli_graph_of_a_traced_model_on_a_paper_platform(run_cli):
    plain = run_cli("graph", "--model", "bert_small_torch", "--platform", "a72", "--json")
    fused = run_cli("graph", "--model", "bert_small_torch", "--platform", "a72", "--json", "--fuse")
    assert plain.returncode == 0 and fused.returncode == 0, plain.stderr + fused.stderr
    assert json.loads(fused.stdout)["n_nodes"] < json.loads(plain.stdout)["n_nodes"]
    models = run_cli("models")
    assert "resnet18_cifar_torch" in models.stdout and "traced" in models.stdout

"""The ``poetlab`` command, run for real in a subprocess."""

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


def test_listing_commands(run_cli):
    platforms = run_cli("platforms")
    assert platforms.returncode == 0 and len(platforms.stdout.splitlines()) == 6
    assert platforms.stdout.splitlines()[-1].startswith("host ")
    models = run_cli("models")
    assert models.returncode == 0 and "resnet18_cifar" in models.stdout


def test_solve_readme_instance_json(run_cli, tmp_path):
    plot = tmp_path / "schedule.png"
    result = run_cli(
        "solve", "--model", "resnet18_cifar", "--platform", "a72", "--ram-budget", "3000000",
        "--runtime-budget", "7.6", "--json", "--plot", str(plot),
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    for key in ("status", "energy_j", "compute_energy_j", "pagein_energy_j", "pageout_energy_j", "runtime_s",
                "peak_ram_bytes", "solve_time_s", "mip_gap", "solver", "n_recomputes", "n_pageouts"):
        assert key in answer
    assert answer["status"] == "optimal"
    assert answer["energy_j"] == pytest.approx(7.8895101827, rel=1e-6)
    assert answer["peak_ram_bytes"] <= 3_000_000
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_solve_text_output_on_a_real_milp(run_cli):
    result = run_cli("solve", "--model", "linear", "--platform", "m0", "--ram-budget", "3708", "--runtime-budget", "2", "--solver", "highs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(("POET optimal (highs,", "POET optimal (bound,"))  # bound: a start meets the eviction bound
    assert "recomputes" in result.stdout


@pytest.mark.parametrize(
    "args,expected,code",
    [
        (("--ram-budget", "-5"), "expected a positive number", 2),
        (("--ram-budget", "0"), "expected a positive number", 2),
        (("--ram-budget", "5000", "--runtime-budget", "0.5"), "factor >= 1", 2),
        (("--ram-budget", "5000", "--solver", "cplex"), "valid solvers: auto, highs, gurobi", 2),
        (("--ram-budget", "100"), "smallest single-node footprint", 1),
    ],
)
def test_solve_bad_input_is_one_line(run_cli, args, expected, code):
    result = run_cli("solve", "--model", "linear", "--platform", "m0", *args)
    assert result.returncode == code
    output = (result.stderr + result.stdout).strip().splitlines()
    assert len(output) == 1 and expected in output[0]
    assert "Traceback" not in result.stderr

"""The `poetlab solve` command, run for real in a subprocess."""

from __future__ import annotations

import json

import pytest


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

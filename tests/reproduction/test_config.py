"""Each stage's configuration read from params.yaml: every preset valid, each bad value named by its key in
one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.reproduction.config import STAGES, SweepConfig, stage_config

from repo_copies import bad_params
from repo_paths import PARAMS, REPO


def test_every_preset_has_valid_reproduction_params():
    for preset in ("smoke", "default", "full"):
        for stage in STAGES:
            stage_config(stage, preset, PARAMS)
    frontier = stage_config("fig3_frontier", "default", PARAMS)
    assert isinstance(frontier, SweepConfig)
    grid = {(m, p) for m in ("resnet18", "resnet50", "vgg16", "bert") for p in ("m0", "m4", "a72", "jetsontx2")}
    cortex_m = {(m, p) for m in ("resnet18_cifar", "bert_seq8") for p in ("m0", "m4")}  # extra_cases: the Cortex-M panels only
    assert set(frontier.cases) == grid | cortex_m and len(frontier.cases) == len(grid) + len(cortex_m)


@pytest.mark.parametrize(
    ("stage", "key", "value", "message"),
    [
        ("fig3_frontier", "platforms", ["m0", "cray1"], "presets.smoke.fig3_frontier.platforms has unknown platform 'cray1'"),
        ("fig3_frontier", "models", ["resnet1000"], "presets.smoke.fig3_frontier.models has unknown model 'resnet1000'"),
        ("fig3_frontier", "fractions", [], "presets.smoke.fig3_frontier.fractions is an empty grid"),
        ("fig3_frontier", "fractions", [0.5, 1.5], "presets.smoke.fig3_frontier.fractions has 1.5"),
        ("fig3_frontier", "extra_cases", [["bert_seq8", "m5"]], "presets.smoke.fig3_frontier.extra_cases has unknown platform 'm5'"),
        ("fig4_runtime", "runtime_factors", [], "presets.smoke.fig4_runtime.runtime_factors is an empty grid"),
        ("fig4_runtime", "cases", [["linear", "nowhere"]], "presets.smoke.fig4_runtime.cases has unknown platform 'nowhere'"),
        ("fig4_runtime", "methods", ["poet", "dtr"], "presets.smoke.fig4_runtime.methods has unknown method 'dtr'"),
        ("fig5_capuchin", "platforms", ["a72", "a99"], "presets.smoke.fig5_capuchin.platforms has unknown platform 'a99'"),
        ("table3_pofo", "time_limit_s", 0, "presets.smoke.table3_pofo.time_limit_s must be a finite number >= 0.1"),
        ("fig3_frontier", "mip_gap", 0.9, "presets.smoke.fig3_frontier.mip_gap must be a finite number in [0, 0.5]"),
        ("table2_platforms", "platforms", ["m0", "m0"], "presets.smoke.table2_platforms.platforms lists a platform twice"),
        ("feasibility", "batch_size", True, "presets.smoke.feasibility.batch_size must be a finite integer"),
        ("claims", "gap_tolerence", 0.1, "presets.smoke.claims.gap_tolerence is not a parameter of this stage"),
        ("techniques_frontier", "relu_density", 1.5, "presets.smoke.techniques_frontier.relu_density must be a finite number in [0, 1]"),
        ("techniques_frontier", "solver", "cplex", "presets.smoke.techniques_frontier.solver is an unknown solver 'cplex'"),
        ("user_models", "models", ["examples/nosuch.py:make"], "presets.smoke.user_models.models names examples/nosuch.py, which is not a file"),
        ("user_models", "models", ["examples/tied.py"], "presets.smoke.user_models.models has 'examples/tied.py'; give each model as path/to/file.py:FUNCTION"),
        ("techniques_frontier", "sparse_scheme", "last-9", "presets.smoke.techniques_frontier.sparse_scheme is not a sparse-update scheme: 'last-9'"),
    ],
)
def test_bad_params_name_the_key(tmp_path, stage, key, value, message):
    path = bad_params(tmp_path, stage, key, value)
    with pytest.raises(InvalidArgumentError) as excinfo:
        stage_config(stage, "smoke", path)
    assert message in str(excinfo.value) and "\n" not in str(excinfo.value)
    with pytest.raises(UnknownNameError, match="valid presets"):
        stage_config(stage, "nosuchpreset", PARAMS)


def test_check_command_prints_one_line(tmp_path):
    bad = bad_params(tmp_path, "fig3_frontier", "platforms", ["cray1"])
    (tmp_path / "data").symlink_to(REPO / "data")
    done = subprocess.run([sys.executable, "-m", "poetlab.reproduction", "check", "fig3_frontier", "smoke"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "presets.smoke.fig3_frontier.platforms" in done.stderr
    good = subprocess.run([sys.executable, "-m", "poetlab.reproduction", "check", "fig3_frontier", "smoke"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr

"""params.yaml and its presets, read through poetlab.reproduction.params: every stage parameterized in every
preset, errors in one line."""

from __future__ import annotations

import pytest
import yaml

from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.reproduction.params import load_params, stage_params

from repo_paths import REPO

PARAMS = REPO / "params.yaml"


def test_presets_share_their_stages():
    params = load_params(PARAMS)
    assert params["preset"] == "default"  # what `make repro` runs and what is committed
    assert set(params["presets"]) == {"smoke", "default", "full"}
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    parameterized = {name for name, stage in stages.items() if f"presets.${{preset}}.{name}" in stage.get("params", [])}
    assert set(stages) - parameterized == {"profile_host", "params_check"}  # the machine measured (frozen); every stage's knobs checked
    assert stages["profile_host"]["frozen"] is True
    for preset in params["presets"].values():
        assert parameterized <= set(preset)


def test_stage_params_errors(tmp_path):
    with pytest.raises(UnknownNameError, match="valid presets"):
        stage_params("graphs", "bogus", PARAMS)
    with pytest.raises(InvalidArgumentError, match="no section"):
        stage_params("nosuchstage", "smoke", PARAMS)
    broken = tmp_path / "params.yaml"
    broken.write_text("presets: [unclosed\n")
    with pytest.raises(InvalidArgumentError, match="not valid YAML"):
        stage_params("graphs", "smoke", broken)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        stage_params("graphs", "smoke", tmp_path / "missing.yaml")

"""The pipeline's parameters: named presets in ``params.yaml``, one section per stage.

``params.yaml`` holds ``preset`` (the one ``dvc repro`` runs) and ``presets``: ``smoke`` (what the test
suite runs, in minutes), ``default`` (what the README's main command runs) and ``full`` (the paper's
full grids). Each stage of ``dvc.yaml`` depends on ``presets.<preset>.<stage>`` alone, so changing a
value re-runs only the stages that read it, and editing an inactive preset re-runs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from poetlab.errors import InvalidArgumentError, UnknownNameError

PARAMS_FILE = "params.yaml"


def load_params(path: str | os.PathLike[str] = PARAMS_FILE) -> dict[str, Any]:
    path = Path(path)
    try:
        params = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror or exc}; run from the repository root") from exc
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); restore it with git checkout {path}") from exc
    if not isinstance(params, dict) or not isinstance(params.get("presets"), dict):
        raise InvalidArgumentError(f"{path} has no 'presets' mapping; restore it with git checkout {path}")
    return params


def stage_params(stage: str, preset: str | None = None, path: str | os.PathLike[str] = PARAMS_FILE) -> dict[str, Any]:
    """The parameters of ``stage`` in ``preset`` (default: the file's active ``preset``)."""
    params = load_params(path)
    preset = params.get("preset", "default") if preset is None else preset
    presets = params["presets"]
    if preset not in presets:
        raise UnknownNameError("preset", preset, presets)
    if stage not in presets[preset]:
        raise InvalidArgumentError(f"{path}: preset {preset!r} has no section {stage!r}; add one (see the other presets)")
    return dict(presets[preset][stage])

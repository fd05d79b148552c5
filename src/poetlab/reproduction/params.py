"""The pipeline's parameters: named presets in ``params.yaml``, one section per stage.

``params.yaml`` holds ``preset`` (the one ``dvc repro`` runs) and ``presets``: ``smoke`` (what the test
suite runs, in minutes), ``default`` (what the README's main command runs) and ``full`` (the paper's
full grids). Each stage of ``dvc.yaml`` depends on ``presets.<preset>.<stage>`` alone, so changing a
value re-runs only the stages that read it, and editing an inactive preset re-runs nothing.
"""

from __future__ import annotations

import os
import re
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


#: What a preset may be called: it names files and keys, so letters, digits, ``_``, ``-`` and ``.`` only,
#: starting with a letter or digit (the pipeline's commands never contain it: the notebooks read it).
PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_preset_name(preset: object, path: str | os.PathLike[str] = PARAMS_FILE) -> str:
    """``preset`` if it is a safe name (:data:`PRESET_NAME`), else a one-line InvalidArgumentError."""
    if not isinstance(preset, str) or not PRESET_NAME.fullmatch(preset):
        raise InvalidArgumentError(
            f"{path}: preset name {preset!r} is not allowed; use letters, digits, '_', '-' and '.' (starting with a letter or digit, at most 64)"
        )
    return preset


def active_preset(path: str | os.PathLike[str] = PARAMS_FILE) -> str:
    """The file's active ``preset:`` (``default`` when it names none), checked like any preset name."""
    return check_preset_name(load_params(path).get("preset", "default"), path)


def stage_params(stage: str, preset: str | None = None, path: str | os.PathLike[str] = PARAMS_FILE) -> dict[str, Any]:
    """The parameters of ``stage`` in ``preset`` (default: the file's active ``preset``)."""
    params = load_params(path)
    preset = active_preset(path) if preset is None else preset
    check_preset_name(preset, path)
    presets = params["presets"]
    if preset not in presets:
        raise UnknownNameError("preset", preset, presets)
    if stage not in presets[preset]:
        raise InvalidArgumentError(f"{path}: preset {preset!r} has no section {stage!r}; add one (see the other presets)")
    return dict(presets[preset][stage])

"""Hostile and malformed input (issue 32): each case is refused with one line, exit 1 or 2, no traceback
and no file left behind. The CLI cases run the real command in a subprocess; the API cases call the
public functions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from conftest import PLATFORM_DIR
from poetlab.errors import PoetlabError


def assert_one_line_refusal(result, workdir: Path | None = None, before: set[str] | None = None) -> None:
    assert result.returncode in (1, 2), (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    if workdir is not None:
        assert {p.name for p in workdir.iterdir()} == (before or set()), "a file was left behind"


# ---- 1. platform expressions -----------------------------------------------------------------------
def _platform_with(tmp_path: Path, key: str, value: object) -> Path:
    spec = yaml.safe_load((PLATFORM_DIR / "a72.yaml").read_text())
    spec["coefficients"][key]["value"] = value
    path = tmp_path / "a72.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


HOSTILE_EXPRESSIONS = {
    "huge_int_power": ("flops_per_s", "2 ** 10000"),
    "float_overflow": ("flops_per_s", "10.0 ** 400"),
    "many_terms": ("flops_per_s", " + ".join(["1"] * 200_000)),
    "subnormal": ("pagein_latency_s", "1e-320"),
    "tower": ("flops_per_s", "9 ** 9 ** 9"),
    "deep_unary": ("flops_per_s", "- " * 100 + "1e9"),
    "huge_literal": ("ram_bytes", "1" + "0" * 300),
    "negative_fractional_power": ("flops_per_s", "(-8) ** 0.5"),
    "zero_negative_power": ("flops_per_s", "0 ** -1"),
    "out_of_range_latency": ("pagein_latency_s", "10 ** 6"),
    "nan": ("flops_per_s", float("nan")),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPRESSIONS))
def test_hostile_platform_expression_cli(case, tmp_path, run_cli):
    key, value = HOSTILE_EXPRESSIONS[case]
    path = _platform_with(tmp_path, key, value)
    before = {p.name for p in tmp_path.iterdir()}
    result = run_cli("graph", "--model", "resnet18", "--platform", str(path), cwd=tmp_path)
    assert_one_line_refusal(result, tmp_path, before)
    assert str(path) in result.stderr and f"coefficients.{key}" in result.stderr


@pytest.mark.parametrize("case", sorted(HOSTILE_EXPRESSIONS))
def test_hostile_platform_expression_api(case, tmp_path):
    from poetlab.core.platforms import load_platform_file

    key, value = HOSTILE_EXPRESSIONS[case]
    with pytest.raises(PoetlabError) as info:
        load_platform_file(_platform_with(tmp_path, key, value))
    assert "\n" not in str(info.value)


def test_release_expressions_still_exact():
    from poetlab.core.platforms import evaluate_number

    assert evaluate_number("(16283 * 100 * 1000) / (13.53) * (2.035 / 1.5) / ((995 - 229) * (10 ** (-3)))") == (
        (16283 * 100 * 1000) / (13.53) * (2.035 / 1.5) / ((995 - 229) * (10 ** (-3)))
    )
    assert evaluate_number("8 * 1024 ** 3") == float(8 * 1024**3)
    assert math.isfinite(evaluate_number("2 ** 64"))

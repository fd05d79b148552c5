"""Loading and validating platform YAML files."""

from __future__ import annotations

import shutil

import pytest
import yaml

from poetlab import available_platforms, load_platform, load_platform_file
from poetlab.errors import PlatformSpecError, UnknownNameError
from poetlab.core.platforms import COEFFICIENT_UNITS, evaluate_number

from repo_paths import PLATFORM_DIR

PAPER_PLATFORMS = ("a72", "a72nocache", "jetsontx2", "m0", "m4")


def test_the_five_paper_platforms_load():
    assert available_platforms() == PAPER_PLATFORMS
    for name in PAPER_PLATFORMS:
        platform = load_platform(name)
        assert platform.name == name
        assert set(platform.sources) == {k for k in COEFFICIENT_UNITS if getattr(platform, k) is not None}
        assert all(source.strip() for source in platform.sources.values())


def test_release_coefficients_are_bit_exact():
    # the release's own expressions (poet/chipsets.py), evaluated by Python
    m0, m4, a72, nocache = (load_platform(n) for n in ("m0", "m4", "a72", "a72nocache"))
    assert m0.flop_per_j == 2000 / (0.012 * 0.020 * 3.3)
    assert m0.flops_per_s == 2000 / 0.012
    assert m4.flops_per_s == (16283 * 100 * 1000) / (255.6237)
    assert a72.flops_per_s == 2e9
    assert a72.flop_per_j == nocache.flop_per_j == (16283 * 100 * 1000) / (13.53 * 0.6 * 5)
    assert nocache.pageout_latency_s == 4.23532 * (10 ** (-3))
    assert a72.memory_power_w == 30 * (10 ** (-3)) * 5


def test_tx2_has_documented_compute_coefficients():
    tx2 = load_platform("jetsontx2")
    assert "poetlab estimate" in tx2.sources["flops_per_s"]
    assert tx2.flop_per_j == pytest.approx(tx2.flops_per_s / tx2.compute_power_w, rel=1e-12)
    assert 1e8 < tx2.flops_per_s < 1e9


def test_expression_evaluator_is_arithmetic_only():
    assert evaluate_number("2 * (3 + 4) / 7 - -1 ** 2") == 2 * (3 + 4) / 7 - -1 ** 2
    assert evaluate_number(5) == 5.0
    for bad in ("__import__('os')", "abs(3)", "x + 1", "1 +", "[1]", "1 / 0"):
        with pytest.raises(ValueError):
            evaluate_number(bad)
    with pytest.raises(ValueError):
        evaluate_number(True)


def _write(tmp_path, name, spec):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def a72_spec():
    return yaml.safe_load((PLATFORM_DIR / "a72.yaml").read_text())


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda s: s.update(colour="red"), "unknown key 'colour'"),
        (lambda s: s["coefficients"].pop("flop_per_j"), "missing field 'coefficients.flop_per_j'"),
        (lambda s: s["coefficients"]["memory_power_w"].update(value=-0.15), "coefficients.memory_power_w.value' must be a positive"),
        (lambda s: s["coefficients"]["memory_power_w"].update(value=0), "must be a positive"),
        (lambda s: s["coefficients"]["memory_power_w"].update(unit="mW"), "must be in 'W', the file says 'mW'"),
        (lambda s: s["coefficients"]["memory_power_w"].pop("source"), "missing field 'coefficients.memory_power_w.source'"),
        (lambda s: s["coefficients"]["flops_per_s"].update(value="open('x')"), "coefficients.flops_per_s.value"),
        (lambda s: s["coefficients"].update(frobs=1), "unknown coefficient 'frobs'"),
        (lambda s: s.pop("description"), "missing field 'description'"),
    ],
)
def test_bad_specs_name_the_file_and_field(tmp_path, a72_spec, mutate, message):
    mutate(a72_spec)
    path = _write(tmp_path, "a72", a72_spec)
    with pytest.raises(PlatformSpecError) as info:
        load_platform_file(path)
    text = str(info.value)
    assert str(path) in text and message in text
    assert "\n" not in text


def test_optional_ram_and_name_must_match_file(tmp_path, a72_spec):
    a72_spec["coefficients"].pop("ram_bytes")
    assert load_platform_file(_write(tmp_path, "a72", a72_spec)).ram_bytes is None
    with pytest.raises(PlatformSpecError, match="file is named 'other'"):
        load_platform_file(_write(tmp_path, "other", a72_spec))


def test_corrupt_and_missing_files(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ncoefficients: {flops_per_s: [1,\n")
    with pytest.raises(PlatformSpecError, match=r"broken.yaml: invalid YAML at line \d+"):
        load_platform_file(broken)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlatformSpecError, match="binary.yaml"):
        load_platform_file(binary)
    with pytest.raises(PlatformSpecError, match="no such platform file"):
        load_platform_file(tmp_path / "nothere.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(PlatformSpecError, match="expected a mapping"):
        load_platform_file(tmp_path / "list.yaml")


def test_platform_directory_and_unknown_name(tmp_path, monkeypatch):
    with pytest.raises(UnknownNameError, match="valid platforms: a72, a72nocache, jetsontx2, m0, m4"):
        load_platform("bogus")
    shutil.copy(PLATFORM_DIR / "m4.yaml", tmp_path / "m4.yaml")
    monkeypatch.setenv("POETLAB_PLATFORM_DIR", str(tmp_path))
    assert available_platforms() == ("m4",)
    assert load_platform("m4") == load_platform("m4", PLATFORM_DIR)
    with pytest.raises(PlatformSpecError, match="not found"):
        available_platforms(tmp_path / "missing")


def test_the_data_folder_comes_from_poetlab_data(monkeypatch, tmp_path):
    from poetlab.core.data import DATA_DIR_ENV, data_dir
    from poetlab.torch.host_profile import default_profile_dir

    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_dir() == tmp_path
    assert default_profile_dir() == tmp_path / "profiles"
    monkeypatch.delenv("POETLAB_PLATFORM_DIR", raising=False)
    assert available_platforms() == ("a72", "a72nocache", "jetsontx2", "m0", "m4")  # built in, not data


def test_platform_names_work_outside_a_checkout(run_cli, tmp_path):
    """From a folder with no data/ above it and no POETLAB_DATA, the paper's platforms still load."""
    listed = run_cli("platforms", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "m4" in listed.stdout and "a72" in listed.stdout
    solved = run_cli("solve", "--model", "linear", "--platform", "m4", "--ram-budget", "3800", "--time-limit", "5", cwd=tmp_path)
    assert solved.returncode == 0, solved.stderr
    assert "optimal" in solved.stdout

"""A committed copy of the checkout to run `dvc repro` in, and what the tests that run it share (the
bad-input and DVC-signal tests of tests/integration/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from repo_paths import PARAMS, REPO


def wait_for(condition, timeout_s: float, what: str):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def repo_copy(tmp_path: Path, edit_smoke=None) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout (its tracked files as they are in the working tree), committed to a fresh git
    repository, on the smoke preset (changed by ``edit_smoke(section)`` where given); and the environment to run it."""
    import os
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "repo"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["preset"] = "smoke"
    if edit_smoke is not None:
        edit_smoke(params["presets"]["smoke"])
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *command], cwd=copy, check=True, timeout=120)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(copy / "src"))
    env.pop("POETLAB_DATA", None)
    env.pop("POETLAB_PLATFORM_DIR", None)
    return copy, env


def outputs(copy: Path) -> dict[str, dict[str, bytes]]:
    return {"experiments": snapshot(copy / "experiments"), "data": snapshot(copy / "data")}


def bad_params(tmp_path: Path, stage: str, key: str, value) -> str:
    """A copy of params.yaml whose smoke preset sets ``stage``'s ``key`` to ``value``: its path."""
    params = yaml.safe_load(PARAMS.read_text())
    params["presets"]["smoke"][stage][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)

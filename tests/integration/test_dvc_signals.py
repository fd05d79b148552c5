"""SIGTERM to `dvc repro` mid-stage (issue 32): DVC has no SIGTERM handler and dies at once; every process
of the stage (the shell, the launcher, papermill, the Jupyter kernel in its session of its own) must die
with it, and nothing may be written afterwards: the stage's partial outputs are removed, the one line says
how to restore the committed ones, and that line works. A real `dvc repro` in a committed copy of the
repository on the smoke preset (:func:`repo_copies.repo_copy`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from poetlab.reproduction.launcher import RESTORE_HINT
from repo_copies import outputs, repo_copy, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")

STAGE = "fig3_frontier"  # (smoke: tens of seconds, most of them in the kernel)


def _run_processes(copy: Path) -> dict[int, str]:
    """Live processes started for the run in ``copy`` (DVC gives each stage's command DVC_ROOT, and every
    process below it inherits it), with their command lines."""
    marker = f"DVC_ROOT={copy}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def _stage_outputs(copy: Path) -> list[Path]:
    spec = yaml.safe_load((copy / "dvc.yaml").read_text())["stages"][STAGE]
    return [copy / next(iter(entry)) for kind in ("outs", "metrics", "plots") for entry in spec.get(kind) or []]


@pytest.mark.parametrize(("how", "shell"), [("SIGTERM to dvc", "/bin/sh"), ("Ctrl-C", "/bin/sh"), ("Ctrl-C", "/bin/bash")])
def test_dvc_stopped_mid_stage_kills_the_stage_and_writes_nothing_after(how, shell, tmp_path):
    """``SIGTERM to dvc``: DVC dies at once. ``Ctrl-C``: SIGINT to the whole process group, as a terminal sends
    it; DVC ignores it while a stage runs, papermill (in a group of its own) gets it through the launcher.
    DVC runs the stage's command in ``$SHELL`` (``/bin/sh`` where unset, as on CI): dash dies of the SIGINT
    at once, bash waits for the launcher; either way the user is told how to restore the outputs."""
    if not Path(shell).exists():
        pytest.skip(f"{shell} is missing")
    copy, env = repo_copy(tmp_path)
    env["SHELL"] = shell
    before = outputs(copy)
    dvc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "-s", STAGE], cwd=copy, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        kernel = lambda: [pid for pid, cmd in _run_processes(copy).items() if "ipykernel_launcher" in cmd]  # noqa: E731
        wait_for(kernel, 240, "the stage's Jupyter kernel")
        wait_for(lambda: (copy / "experiments/notebooks" / f"{STAGE}.ipynb").exists(), 120, "papermill's first write")
        time.sleep(1.0)  # (the kernel is running the notebook's cells)
        running = _run_processes(copy)
        if how == "Ctrl-C":
            os.killpg(dvc.pid, signal.SIGINT)
        else:
            dvc.send_signal(signal.SIGTERM)
        dvc.wait(timeout=30)
        try:
            wait_for(lambda: not _run_processes(copy), 10, "every process of the stage to die with dvc")
        except AssertionError as error:
            raise AssertionError(f"{error}; still alive: {_run_processes(copy)}") from None
        finally:
            for pid in _run_processes(copy):  # (the old behaviour: papermill and its kernel run on)
                os.kill(pid, signal.SIGKILL)
        _, stderr = dvc.communicate(timeout=30)  # (the stage's processes held dvc's stderr: it ends with them)
    finally:
        if dvc.poll() is None:
            dvc.kill()
    if how == "SIGTERM to dvc":
        assert dvc.returncode == -signal.SIGTERM, ("dvc was not stopped mid-stage", stderr)
    else:
        assert dvc.returncode != 0 and f"failed to reproduce '{STAGE}'" in stderr, stderr
    assert any("papermill" in cmd for cmd in running.values()), running
    settled = outputs(copy)  # (only now: the stage's processes are gone)
    time.sleep(3)
    assert outputs(copy) == settled, "an output was written after dvc and its stage were gone"
    leftovers = [p for p in _stage_outputs(copy) if p.exists()]
    leftovers += [p for p in (copy / "experiments").rglob(".*.tmp")]
    assert leftovers == [], f"half-written outputs left: {leftovers}"
    assert f"poetlab: stage {STAGE} stopped" in stderr and "Traceback" not in stderr, stderr
    assert RESTORE_HINT in stderr.split(f"poetlab: stage {STAGE} stopped", 1)[1].splitlines()[0], stderr
    subprocess.run(["git", "checkout", "experiments"], cwd=copy, check=True, capture_output=True, timeout=60)
    assert outputs(copy) == before

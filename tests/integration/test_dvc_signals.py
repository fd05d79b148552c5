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


# ---- the launcher on its own: a fake stage whose command leaves a process in a session of its own ----------
CHILD = """
import os, subprocess, sys, time
open(sys.argv[1], "w").write("half")
open(os.path.join(os.path.dirname(sys.argv[1]), ".out.txt.abc.tmp"), "w").write("cut short")
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)  # as papermill starts its kernel
open(sys.argv[2], "w").write(str(kernel.pid))
time.sleep(300)
"""


def _fake_stage(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"fake": {"cmd": "x", "outs": [{"out.txt": {"cache": False}}, {"kept.txt": {"persist": True}}]}}}))
    (tmp_path / "kept.txt").write_text("kept")
    return tmp_path, dict(os.environ, DVC_ROOT=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))


def _launch(tmp_path: Path, env: dict[str, str], parent: int | None) -> subprocess.Popen:
    head = ["--parent", str(parent)] if parent is not None else []
    return subprocess.Popen([sys.executable, "-m", "poetlab.reproduction", "run", "fake", *head, "--", sys.executable, "-c", CHILD,
                             str(tmp_path / "out.txt"), str(tmp_path / "kernel.pid")], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("how", ["parent_killed", "SIGTERM", "SIGINT"])
def test_launcher_ends_everything_below_it_and_removes_partial_outputs(how, tmp_path):
    root, env = _fake_stage(tmp_path)
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # stands for dvc
    launcher = _launch(root, env, watched.pid)
    try:
        pid = int(wait_for(lambda: (root / "kernel.pid").exists() and (root / "kernel.pid").read_text(), 60, "the fake kernel"))
        if how == "parent_killed":
            watched.kill()
        else:
            launcher.send_signal(getattr(signal, how))
        _, stderr = launcher.communicate(timeout=30)
        wait_for(lambda: not _alive(pid), 5, "the fake kernel to die")
    finally:
        for process in (watched, launcher):
            if process.poll() is None:
                process.kill()
    assert launcher.returncode == {"parent_killed": 1, "SIGTERM": 143, "SIGINT": 130}[how], stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1 and "stage fake stopped" in stderr, stderr
    assert sorted(p.name for p in root.iterdir()) == ["dvc.yaml", "kept.txt", "kernel.pid"]  # out.txt and its temporary file removed


def test_launcher_passes_the_commands_exit_code_and_refuses_bad_use(tmp_path):
    root, env = _fake_stage(tmp_path)
    run = lambda *args: subprocess.run([sys.executable, "-m", "poetlab.reproduction", "run", *args], cwd=root, env=env, capture_output=True, text=True, timeout=60)  # noqa: E731
    assert run("fake", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7
    assert run("fake", "--parent", "", "--", sys.executable, "-c", "pass").returncode == 0  # (a shell without $PPID)
    for bad in (["nosuch", "--", "true"], ["fake"], ["fake", "--"], ["fake", "--parent", "x", "--", "true"], ["fake", "--", str(root / "no-such-command")]):
        result = run(*bad)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, (bad, result.stderr)


def test_launcher_does_not_start_the_command_when_dvc_is_already_gone(tmp_path):
    root, env = _fake_stage(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    launcher = _launch(root, env, gone.pid)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 1 and "dvc had already ended" in stderr, stderr
    assert not (root / "kernel.pid").exists()

"""The stage launcher on its own (poetlab.reproduction.launcher), on a fake stage whose command leaves a
process in a session of its own: it ends everything below it and removes partial outputs, passes the
command's exit code, refuses bad use in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repo_copies import wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


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

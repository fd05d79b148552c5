"""``python -m poetlab.reproduction run STAGE [--parent PID] -- COMMAND...``: how a stage of ``dvc.yaml``
runs its notebook, so that the notebook dies with ``dvc repro``.

DVC runs a stage's command in a shell and has no SIGTERM handler: killed, it leaves the shell, papermill
and the Jupyter kernel (which papermill starts in a session of its own) running, and they go on writing
the stage's outputs after ``dvc repro`` has ended. So each stage runs papermill through this launcher
(``... run STAGE --parent "$PPID" -- papermill ...``; ``$PPID`` is the shell's parent, DVC), which

- watches DVC, known by its pid and start time (a pid reused by another process is not mistaken for it);
  without ``--parent`` it watches its own parent;
- starts COMMAND in a process group of its own, which Linux sends SIGKILL should the launcher itself be
  killed (``PR_SET_PDEATHSIG``), and adopts what COMMAND's processes leave orphaned
  (``PR_SET_CHILD_SUBREAPER``), so the Jupyter kernel stays below it;
- when DVC ends, or on SIGTERM, SIGINT or SIGHUP: ends every process below it, and every process whose
  environment carries its :data:`RUN_MARKER` (the kernel's workers can leave the tree before the launcher
  adopts them) (SIGTERM, then SIGKILL after ``GRACE_S``), removes the stage's outputs as ``dvc.yaml`` declares them (DVC removed the committed
  ones before the stage ran, so what is there is this run's half) with the temporary files of atomic
  writes cut short beside them, prints one line that ends with :data:`RESTORE_HINT` and exits non-zero.
  The line says how to restore the committed outputs itself: the stage's
  ``|| python -m poetlab.reproduction failed STAGE`` does not run after a Ctrl-C where DVC's shell is
  ``/bin/sh`` (dash, DVC's choice when ``SHELL`` is unset), which dies of the terminal's SIGINT before
  ``||``. Outputs DVC keeps (``persist``) are left alone.

After COMMAND ends by itself, whatever it left running below the launcher is killed too. Linux (``/proc``,
``prctl``) gets all of this; elsewhere the launcher still watches DVC and kills COMMAND's process group.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from poetlab.core.files import atomic_write_leftovers
from poetlab.errors import InvalidArgumentError

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
WATCH_EVERY_S = 0.1
GRACE_S = 2.0  # between SIGTERM and SIGKILL to what runs below the launcher
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: set to the launcher's pid in its command's environment, which the kernel and its workers inherit
RUN_MARKER = "POETLAB_STAGE_LAUNCHER"
#: how a user gets back what a failed or stopped stage removed (DVC removes a stage's outputs before it runs)
RESTORE_HINT = "`git checkout experiments` restores the committed outputs"


@dataclass(frozen=True)
class Watched:
    """A process known by pid and start time (clock ticks since boot; None where ``/proc`` is missing)."""

    pid: int
    start: int | None

    def alive(self) -> bool:
        if self.start is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return _start_time(self.pid) == self.start


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None for a process gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def watched_process(parent: int | None) -> Watched | None:
    """The process whose end stops the stage: ``parent`` (DVC) or this process's parent; None when
    ``parent`` is already gone (or is a later process that reused its pid: it started after this one)."""
    if not Path("/proc/self/stat").exists():
        return Watched(parent or os.getppid(), None)
    if parent is None:
        return Watched(os.getppid(), _start_time(os.getppid()))
    start, own_start = _start_time(parent), _start_time(os.getpid())
    if start is None or (own_start is not None and start > own_start):
        return None
    return Watched(parent, start)


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(option, value)
        except (OSError, AttributeError):
            pass


def _die_with_launcher() -> None:  # (in the child, between fork and exec)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _descendants(root: int, marker: bytes | None = None) -> list[int]:
    """Live processes below ``root`` (children first), read from ``/proc``, and those whose environment
    holds ``marker`` (:data:`RUN_MARKER`, which the launcher gives its command): a process that left the
    tree, its parent ended before this one could adopt it, is still found by what it inherited."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    if marker is not None:
        for pids in children.values():
            for pid in pids:
                if pid not in found and pid != root and _has_marker(pid, marker):
                    found.append(pid)
    return found


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _reap() -> None:
    """Collect the exit status of every ended child (orphans adopted as subreaper included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_below(command: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """End COMMAND's process group and every process below this one: SIGTERM (a ``poetlab`` command then
    removes its page files), and SIGKILL for what is still there after ``grace_s``."""
    marker = f"{RUN_MARKER}={os.getpid()}".encode()
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        try:
            os.killpg(command.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        if not Path("/proc/self/stat").exists():
            try:
                command.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + wait_s
        sent: set[int] = set()
        while time.monotonic() < deadline:
            below = _descendants(os.getpid(), marker)
            if not below:
                break
            for pid in set(below) - sent:  # (once each: a second SIGTERM may cut a cleanup short)
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
                sent.add(pid)
            time.sleep(0.02)
            _reap()
        _reap()
        if not _descendants(os.getpid(), marker):
            return


def stage_outputs(stage: str, root: Path) -> list[Path]:
    """The files ``dvc.yaml`` (in ``root``) declares as ``stage``'s outputs, metrics and plots, except
    those DVC keeps between runs (``persist``)."""
    try:
        spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]
        wdir = root / spec.get("wdir", ".")
        found = []
        for kind in ("outs", "metrics", "plots"):
            for entry in spec.get(kind) or []:
                path, options = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
                if not (options or {}).get("persist", False):
                    found.append(wdir / path)
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        raise InvalidArgumentError(f"no stage {stage!r} in {root / 'dvc.yaml'} ({type(exc).__name__}); run this from the repository's root") from exc
    return found


def remove_outputs(paths: list[Path]) -> None:
    """Remove ``paths`` and the temporary files of atomic writes to them cut short
    (:func:`poetlab.core.files.atomic_write_leftovers`)."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        for tmp in atomic_write_leftovers(path):
            tmp.unlink(missing_ok=True)


def run_stage(stage: str, command: list[str], parent: int | None) -> int:
    """Run ``command`` for ``stage`` under the watch described in the module docstring; its exit code,
    or non-zero when it was stopped. :class:`~poetlab.errors.InvalidArgumentError` for a stage that
    ``dvc.yaml`` lacks or a command that cannot start."""
    root = Path(os.environ.get("DVC_ROOT", "."))
    outputs = stage_outputs(stage, root)  # (read first: a dvc.yaml edited meanwhile does not matter)
    ended: list[int] = []

    def on_signal(signum, _frame) -> None:
        ended.append(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in ENDING_SIGNALS}
    try:
        watched = watched_process(parent)
        if watched is None:
            why = "dvc had already ended"
        else:
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            try:
                process = subprocess.Popen(command, process_group=0, preexec_fn=_die_with_launcher, env={**os.environ, RUN_MARKER: str(os.getpid())})
            except OSError as exc:
                raise InvalidArgumentError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
            why = None
            while why is None:
                try:
                    code = process.wait(timeout=WATCH_EVERY_S)
                except subprocess.TimeoutExpired:
                    code = None
                if ended:
                    why = f"{signal.Signals(ended[0]).name} received"
                elif not watched.alive():
                    why = f"{'dvc' if parent is not None else 'its parent process'} (pid {watched.pid}) ended"
                elif code is not None:
                    kill_below(process)  # (what it left running)
                    return code
            kill_below(process)
        remove_outputs(outputs)
        try:
            print(f"poetlab: stage {stage} stopped ({why}): its processes ended, its partial outputs removed; {RESTORE_HINT}",
                  file=sys.stderr)
        except OSError:
            pass  # (DVC's end closed the pipe this went to)
        return 128 + ended[0] if ended else 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

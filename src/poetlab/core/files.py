"""Small file helpers shared by the modules that write outputs."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from poetlab.errors import OutputError, PoetlabError


def output_target(path: str | os.PathLike[str]) -> Path:
    """Where an output named ``path`` is really written: the target of a symbolic link (so that the link is
    written through, not replaced), ``path`` itself otherwise. A target that exists and is not a regular
    file (a directory, a device such as /dev/full, a pipe) is refused with one line: replacing it with a
    file would destroy it, and writing into it is not writing an output."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}; choose another path") from None
    if stat.S_ISDIR(mode):
        raise OutputError(f"cannot write {path}: it is a directory; give a file name")
    if not stat.S_ISREG(mode):
        raise OutputError(f"cannot write {path}: it is not a regular file (a device or a pipe); give a file name")
    return target


def new_file_mode(existing: Path) -> int:
    """The mode an output gets: the mode of the file it replaces, else 0666 less the user's umask (0644
    under the usual umask 022), as ``open`` would give it; never mkstemp's private 0600."""
    try:
        return stat.S_IMODE(existing.stat().st_mode)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_TMP_SUFFIX = ".tmp"


def atomic_write_leftovers(path: str | os.PathLike[str]) -> list[Path]:
    """The temporary files :func:`write_text_atomic` left beside ``path`` when a write to it was killed
    before its rename (a killed process runs no cleanup)."""
    path = Path(path)
    return sorted(path.parent.glob(f".{path.name}.*{_TMP_SUFFIX}")) if path.parent.is_dir() else []


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    An interrupted run or a full disk leaves either the old file or the new one, never half of one. A
    symbolic link is written through to its target; a directory or device is refused
    (:func:`output_target`); the file gets the mode of :func:`new_file_mode`.
    """
    path = Path(path)
    target = output_target(path)
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=_TMP_SUFFIX)
        os.fchmod(fd, new_file_mode(target))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        reason = exc.strerror or str(exc)
        raise OutputError(f"cannot write {path}: {reason}; free some space or choose another path") from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], data: object) -> Path:
    """Write ``data`` as indented JSON (keys sorted, so reruns give the same bytes), atomically."""
    import json

    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_text_or_raise(path: Path, error: type[PoetlabError], missing: str, unreadable: str) -> str:
    """The UTF-8 text of ``path``, or ``error`` with one line: ``missing`` when there is no such file,
    ``unreadable`` (followed by the OS's reason) when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: {unreadable} ({exc})") from None


def read_json_file(path: str | os.PathLike[str], error: type[PoetlabError], what: str) -> object:
    """The JSON that ``path`` holds; ``error`` with one line naming the file (``what`` says which kind) if
    it is missing, cannot be read or is not JSON. What the data must be is the caller's to check."""
    text = read_text_or_raise(Path(path), error, f"cannot read the {what} file (no such file)", f"cannot read the {what} file")
    return parse_json(text, str(path), error)


def parse_json(text: str, origin: str, error: type[PoetlabError]) -> object:
    """``text`` parsed as JSON; ``error`` with one line naming ``origin`` where it is not."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{origin}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{origin}: the JSON is nested too deeply to be a poetlab file") from None

"""Small file helpers shared by the modules that write outputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from poetlab.errors import OutputError, PoetlabError


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    An interrupted run or a full disk leaves either the old file or the new one, never half of one.
    """
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
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

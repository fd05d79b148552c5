"""Writing outputs atomically (a killed or failed write leaves the old file or the new one, never half),
through symbolic links, never over a directory or a device; reading JSON files with one-line errors."""

from __future__ import annotations

import os
import stat

import pytest

from poetlab.core.files import (
    atomic_write_leftovers,
    new_file_mode,
    output_target,
    parse_json,
    read_json_file,
    write_json_atomic,
    write_text_atomic,
)
from poetlab.errors import GraphFileError, OutputError


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "out.txt"
    assert write_text_atomic(path, "first") == path  # (the folder is made)
    write_text_atomic(path, "second")
    assert path.read_text() == "second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.txt"] and atomic_write_leftovers(path) == []


def test_leftovers_of_a_killed_write_are_found(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("{}")
    killed = tmp_path / ".out.json.abc123.tmp"  # the name a write's temporary file has
    killed.write_text("{")
    (tmp_path / ".other.json.x.tmp").write_text("")  # another output's: not this one's
    assert atomic_write_leftovers(path) == [killed]
    assert atomic_write_leftovers(tmp_path / "missing-folder" / "out.json") == []


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    path.write_text("old")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OutputError, match="No space left on device; free some space or choose another path") as info:
        write_text_atomic(path, "new")
    assert "\n" not in str(info.value)
    assert path.read_text() == "old" and atomic_write_leftovers(path) == []


def test_a_link_is_written_through_and_a_directory_refused(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert output_target(link) == target
    write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    with pytest.raises(OutputError, match="it is a directory; give a file name"):
        write_text_atomic(tmp_path, "x")
    if os.path.exists("/dev/null"):
        with pytest.raises(OutputError, match="not a regular file"):
            output_target("/dev/null")


def test_a_new_file_gets_the_umasks_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    previous = os.umask(0o027)
    try:
        assert new_file_mode(tmp_path / "new") == 0o640
        path = write_text_atomic(tmp_path / "new", "x")
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
    finally:
        os.umask(previous)
    path.chmod(0o600)
    write_text_atomic(path, "y")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_json_is_written_with_sorted_keys_so_reruns_give_the_same_bytes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_json_atomic(a, {"b": 1, "a": [1, 2]})
    write_json_atomic(b, {"a": [1, 2], "b": 1})
    assert a.read_bytes() == b.read_bytes() and a.read_text().endswith("}\n")
    assert read_json_file(a, GraphFileError, "graph") == {"a": [1, 2], "b": 1}


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "cannot read the graph file (no such file)"),
        ("{not json", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_json_files_that_cannot_be_read_are_one_line(tmp_path, text, message):
    path = tmp_path / "g.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(GraphFileError, match="g.json: ") as info:
        read_json_file(path, GraphFileError, "graph")
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(GraphFileError, match=r"^here: not valid JSON \(Expecting value at line 1\)"):
        parse_json("", "here", GraphFileError)

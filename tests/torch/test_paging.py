"""The page store: storages written to private files and read back byte for byte, now or on a background
thread; counted; removed on close; a disk that fails is one line naming the fix."""

from __future__ import annotations

import shutil
import stat

import pytest
import torch

from poetlab.torch.paging import PageStore, PagingError


def _storages():
    torch.manual_seed(0)
    return [torch.randn(1000).untyped_storage(), torch.arange(37, dtype=torch.int16).untyped_storage()]


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("durable", [True, False])
def test_what_is_paged_out_comes_back_byte_for_byte(tmp_path, prefetch, durable):
    a, b = _storages()
    with PageStore(tmp_path, prefetch=prefetch, durable=durable) as store:
        store.write("t", [a, b])
        assert store.bytes_written == a.nbytes() + b.nbytes() == store.path("t").stat().st_size
        back_a, back_b = torch.empty(1000).untyped_storage(), torch.empty(37, dtype=torch.int16).untyped_storage()
        pending = store.read_into("t", [(a.nbytes(), back_b), (0, back_a)])  # any order, by offset
        assert (pending is not None) == prefetch
        if pending is not None:
            pending.result()
        assert bytes(back_a) == bytes(a) and bytes(back_b) == bytes(b)
        assert store.bytes_read == store.bytes_written
        directory = store.directory
    assert not directory.exists() and list(tmp_path.iterdir()) == []


def test_page_files_are_private_to_the_user(tmp_path):
    with PageStore(tmp_path) as store:
        store.write("t", _storages()[:1])
        assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(store.path("t").stat().st_mode) == 0o600


def test_a_removed_paging_directory_is_one_line_naming_the_fix(tmp_path):
    (a, _) = _storages()
    with PageStore(tmp_path) as store:
        store.write("t", [a])
        shutil.rmtree(store.directory)
        with pytest.raises(PagingError, match="the paging directory disappeared during the step; keep it in place") as info:
            store.read_into("t", [(0, torch.empty(1000).untyped_storage())])
        assert "\n" not in str(info.value)


def test_a_short_file_is_an_error_not_a_silent_half_tensor(tmp_path):
    with PageStore(tmp_path) as store:
        store.write("t", [torch.zeros(10).untyped_storage()])
        with pytest.raises(PagingError, match="shorter than the tensor"):
            store.read_into("t", [(0, torch.empty(1000).untyped_storage())])


def test_an_unusable_parent_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(PagingError, match="cannot create a paging directory under .*; pass a writable --paging-dir"):
        PageStore(tmp_path / "file" / "below")

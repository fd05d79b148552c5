"""Paging to real files: the flash of POET's model, as a private directory on the host's disk.

A :class:`PageStore` writes the bytes of a tensor's storages (a node's output and what autograd saved
for it) to one file when a schedule pages it out and reads them back into the same storages when the
schedule pages it in, so a paged tensor costs no RAM in between and keeps its identity (autograd still
holds the same tensor object). One file and one ``fsync`` per page-out, as the cost model charges one
page-out latency per tensor: a file per storage paid that latency up to four times for a ResNet node
(its convolution's and its BatchNorm's outputs and two small statistics). The directory is created
with ``mkdtemp`` (mode 0700), each file with mode 0600, and everything is removed by :meth:`close`, which
the executor calls in a ``finally`` (so also on error). Any ``OSError`` (a full disk, a directory removed
mid-step) becomes one :class:`PagingError` line that says what to do.

Page-ins can run ahead on one background thread (``prefetch``): the read is issued when the schedule
pages the tensor in and waited for only when the tensor is first used, the overlap of transfer and
compute that POET's cost model assumes. Writes stay synchronous: a page-out is followed by a free, and
the bytes must be on disk before the RAM goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from poetlab.errors import PoetlabError


class PagingError(PoetlabError, OSError):
    """A page-out or page-in that the paging directory could not serve (full, removed, unreadable)."""


def _byte_view(storage: torch.UntypedStorage) -> memoryview:
    """The storage's bytes as a writable memoryview, without copying. Through ctypes, not ``.numpy()``:
    sharing a storage with numpy marks it non-resizable for good, and freeing resizes it."""
    nbytes = storage.nbytes()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(storage.data_ptr())).cast("B")


class PageStore:
    """Files of paged-out storages in a private temporary directory under ``parent``.

    Counts ``bytes_written`` and ``bytes_read``; ``close()`` removes every file and the directory.
    ``durable`` (the default) syncs each page-out to the disk and drops it from the page cache, as
    :mod:`poetlab.torch.profile` does when it measures paging, so that a page-in really reads the disk and the
    measured time matches the profiled one; without it, page-ins are served from the page cache.
    """

    def __init__(self, parent: str | os.PathLike[str] | None = None, prefetch: bool = False, durable: bool = True):
        try:
            if parent is not None:
                Path(parent).mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix="poetlab-pages-", dir=parent))
        except OSError as exc:
            raise PagingError(
                f"cannot create a paging directory under {parent or tempfile.gettempdir()}: {exc.strerror or exc}; "
                "pass a writable --paging-dir"
            ) from None
        self.durable = durable
        self.bytes_written = 0
        self.bytes_read = 0
        self.wall_s = 0.0  # in page-outs and synchronous page-ins (not in prefetching reads)
        self.cpu_s = 0.0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poetlab-pagein") if prefetch else None
        self._closed = False

    @property
    def cache_bypass(self) -> str:
        """How a page-in is kept from being served by the page cache (the disk profile records it)."""
        if self.durable and hasattr(os, "posix_fadvise"):
            return "posix_fadvise(DONTNEED) after the fsync"
        return "none (page-ins may be served from the page cache)"

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.bin"

    def _timed(self, io: Callable[[str, object], None], key: str, what: object) -> None:
        """Run ``io`` on this thread, adding its wall and CPU time to the store's."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            io(key, what)
        finally:
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.thread_time() - cpu

    def write(self, key: str, storages: Sequence[torch.UntypedStorage]) -> None:
        """Write the bytes of ``storages``, one after the other, to the file of ``key`` (replacing an older
        copy), synced once."""
        self._timed(self._write, key, storages)

    def _write(self, key: str, storages: Sequence[torch.UntypedStorage]) -> None:
        path = self.path(key)
        total = sum(storage.nbytes() for storage in storages)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb", buffering=0) as handle:
                for storage in storages:
                    view = _byte_view(storage)
                    written = 0
                    while written < len(view):
                        written += handle.write(view[written:])
                if self.durable:
                    os.fsync(handle.fileno())
                    if hasattr(os, "posix_fadvise"):  # so that the page-in reads the disk, not the page cache
                        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)  # no half-written page left behind
            raise self._error(exc, f"cannot page {total:,} bytes out to {self.directory}", "free disk space or choose another paging directory") from None
        self.bytes_written += total

    def _read(self, key: str, parts: Sequence[tuple[int, torch.UntypedStorage]]) -> None:
        path = self.path(key)
        total = 0
        try:
            with open(path, "rb", buffering=0) as handle:
                for offset, storage in parts:
                    handle.seek(offset)
                    view = _byte_view(storage)
                    read = 0
                    while read < len(view):
                        n = handle.readinto(view[read:])
                        if not n:
                            raise OSError(0, f"file {path.name} is shorter than the tensor")
                        read += n
                    total += read
        except OSError as exc:
            raise self._error(exc, f"cannot page a tensor back in from {self.directory}", "the paging directory must stay in place during the step") from None
        self.bytes_read += total

    def _error(self, exc: OSError, what: str, fix: str) -> PagingError:
        if not self.directory.is_dir():
            return PagingError(f"{what}: the paging directory disappeared during the step; keep it in place until the step ends")
        return PagingError(f"{what}: {exc.strerror or exc}; {fix}")

    def read_into(self, key: str, parts: Sequence[tuple[int, torch.UntypedStorage]]) -> Future[None] | None:
        """Read the file of ``key`` back into storages (already sized), each ``(offset in the file,
        storage)``: now, or on the background thread when prefetching (the returned future is done when
        the bytes are in)."""
        if self._pool is None:
            self._timed(self._read, key, parts)
            return None
        return self._pool.submit(self._read, key, parts)

    def close(self) -> None:
        """Stop the reader thread and remove the directory with every file in it."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

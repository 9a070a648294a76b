"""The disk tier's I/O backend: positional file I/O that releases the GIL.

Each open file has a buffered descriptor and, where the filesystem accepts it, an O_DIRECT one.
A request goes through O_DIRECT when its offset, length and buffer address are all 4 KiB
aligned (the store's payload I/O), else through the page cache (headers, superblock). Linux
keeps the two coherent for the disjoint ranges the store uses. `os.preadv`/`os.pwrite` drop
the GIL for the whole system call, so several disk worker threads overlap.

`FaultInjectingIO` (tests) fails, tears or "crashes" chosen writes and reads.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tieredkv.cache.disk.format import ALIGN_BYTES

logger = logging.getLogger(__name__)

Buffer = np.ndarray | memoryview | bytearray | bytes


def as_bytes(buffer: Buffer) -> np.ndarray:
    """A flat uint8 view of a contiguous buffer (no copy)."""
    return (
        np.frombuffer(buffer, dtype=np.uint8)
        if not isinstance(buffer, np.ndarray)
        else (buffer.reshape(-1).view(np.uint8))
    )


def is_aligned(array: np.ndarray) -> bool:
    return array.ctypes.data % ALIGN_BYTES == 0 and array.nbytes % ALIGN_BYTES == 0


@dataclass
class _OpenFile:
    fd: int  # buffered
    direct_fd: int | None  # O_DIRECT, None when the filesystem refused it or it is disabled


class DiskIOBackend:
    """Positional, thread-safe file I/O. Handles are small ints; `pread`/`pwrite` may be called
    from any number of threads at once on disjoint ranges."""

    def __init__(self, direct_io: bool = True) -> None:
        self.want_direct = direct_io and hasattr(os, "O_DIRECT")
        self._files: dict[int, _OpenFile] = {}
        self._lock = threading.Lock()
        self._next_handle = 1

    def open(self, path: Path, size_bytes: int, create: bool) -> int:
        """Open `path` read-write, never through a symlink (ELOOP). `create`: make a new file
        (mode 0o600, must not exist) and preallocate `size_bytes`; on failure nothing is left
        behind and OSError (ENOSPC...) propagates. Otherwise open the existing file and extend
        it to `size_bytes` if shorter."""
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.fchmod(fd, 0o600)  # exact mode whatever the umask
            if os.fstat(fd).st_size < size_bytes:
                self._preallocate_fd(fd, size_bytes)
            direct_fd = self._open_direct(path) if self.want_direct else None
        except BaseException:
            os.close(fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        return self._register(_OpenFile(fd, direct_fd))

    def _open_direct(self, path: Path) -> int | None:
        try:
            return self._os_open_direct(path)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            logger.info("O_DIRECT refused for %s (%s): using buffered I/O", path, error)
            return None

    def _os_open_direct(self, path: Path) -> int:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECT)

    def _register(self, file: _OpenFile) -> int:
        with self._lock:
            handle = self._next_handle
            self._next_handle += 1
            self._files[handle] = file
        return handle

    def lock(self, path: Path) -> int:
        """Create/open the lock file `path` (0o600, never through a symlink) and take an
        exclusive, non-blocking flock.
        Raises BlockingIOError when another open file description holds it."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return self._register(_OpenFile(fd, None))

    def is_direct(self, handle: int) -> bool:
        return self._files[handle].direct_fd is not None

    def size(self, handle: int) -> int:
        return os.fstat(self._files[handle].fd).st_size

    def preallocate(self, handle: int, size_bytes: int) -> None:
        self._preallocate_fd(self._files[handle].fd, size_bytes)

    def _preallocate_fd(self, fd: int, size_bytes: int) -> None:
        os.posix_fallocate(fd, 0, size_bytes)

    def _pick_fd(self, handle: int, offset: int, view: np.ndarray) -> int:
        file = self._files[handle]
        if file.direct_fd is not None and offset % ALIGN_BYTES == 0 and is_aligned(view):
            return file.direct_fd
        return file.fd

    def pread(self, handle: int, offset: int, length: int, out: Buffer) -> None:
        """Read exactly `length` bytes at `offset` into `out`; OSError (EIO) on a short file."""
        view = as_bytes(out)[:length]
        assert view.nbytes == length, f"pread buffer holds {view.nbytes} < {length} bytes"
        fd = self._pick_fd(handle, offset, view)
        done = 0
        while done < length:
            count = os.preadv(fd, [view[done:]], offset + done)
            if count == 0:
                raise OSError(errno.EIO, f"short read: file ends before {offset + length}")
            done += count

    def pwrite(self, handle: int, offset: int, data: Buffer) -> None:
        """Write all of `data` at `offset`."""
        view = as_bytes(data)
        fd = self._pick_fd(handle, offset, view)
        done = 0
        while done < view.nbytes:
            done += os.pwrite(fd, view[done:], offset + done)

    def fsync(self, handle: int) -> None:
        os.fsync(self._files[handle].fd)

    def close(self, handle: int) -> None:
        """Close a file or lock handle (closing the lock file releases the flock)."""
        with self._lock:
            file = self._files.pop(handle, None)
        if file is None:
            return
        for fd in (file.direct_fd, file.fd):
            if fd is not None:
                os.close(fd)


class SimulatedCrash(BaseException):
    """The process "died" (kill -9) during I/O: the file keeps what was written before, and the
    backend accepts no more I/O. A BaseException so that no `except Exception` swallows it."""


class FaultInjectingIO(DiskIOBackend):
    """A backend for tests. Faults are armed relative to the writes/reads done so far: `after=k`
    lets k more operations succeed first. Every `pwrite`/`pread` call counts as one."""

    def __init__(
        self, direct_io: bool = True, refuse_direct: bool = False, max_file_bytes: int | None = None
    ) -> None:
        super().__init__(direct_io)
        self.refuse_direct = refuse_direct  # the filesystem rejects O_DIRECT (EINVAL)
        self.max_file_bytes = max_file_bytes  # preallocating more fails with ENOSPC
        self.num_writes = 0
        self.num_reads = 0
        self.crashed = False
        self._write_faults: dict[int, tuple[str, int]] = {}  # index -> (kind, errno | bytes)
        self._read_faults: dict[int, int] = {}  # index -> errno

    def fail_write(self, error_code: int, after: int = 0) -> None:
        """The write after `after` more raises OSError(error_code) without writing anything."""
        self._write_faults[self.num_writes + after] = ("error", error_code)

    def fail_read(self, error_code: int, after: int = 0) -> None:
        self._read_faults[self.num_reads + after] = error_code

    def tear_write(self, keep_bytes: int, after: int = 0) -> None:
        """That write stores only its first `keep_bytes` bytes, then the process crashes."""
        self._write_faults[self.num_writes + after] = ("tear", keep_bytes)

    def crash_after_writes(self, count: int) -> None:
        """`count` more writes complete; the next one crashes before writing anything."""
        self._write_faults[self.num_writes + count] = ("tear", 0)

    def _os_open_direct(self, path: Path) -> int:
        if self.refuse_direct:
            raise OSError(errno.EINVAL, "O_DIRECT not supported (simulated)")
        return super()._os_open_direct(path)

    def _check_alive(self) -> None:
        if self.crashed:
            raise SimulatedCrash("the simulated process has crashed; no more I/O")

    def _crash(self) -> None:
        self.crashed = True
        for handle in list(self._files):  # the kernel closes every fd of a killed process
            super().close(handle)
        raise SimulatedCrash("simulated kill -9 during a write")

    def open(self, path: Path, size_bytes: int, create: bool) -> int:
        self._check_alive()
        return super().open(path, size_bytes, create)

    def lock(self, path: Path) -> int:
        self._check_alive()
        return super().lock(path)

    def _preallocate_fd(self, fd: int, size_bytes: int) -> None:
        self._check_alive()
        if self.max_file_bytes is not None and size_bytes > self.max_file_bytes:
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        super()._preallocate_fd(fd, size_bytes)

    def pread(self, handle: int, offset: int, length: int, out: Buffer) -> None:
        self._check_alive()
        with self._lock:
            error_code = self._read_faults.pop(self.num_reads, None)
            self.num_reads += 1
        if error_code is not None:
            raise OSError(error_code, f"{os.strerror(error_code)} (simulated read fault)")
        super().pread(handle, offset, length, out)

    def pwrite(self, handle: int, offset: int, data: Buffer) -> None:
        self._check_alive()
        with self._lock:
            fault = self._write_faults.pop(self.num_writes, None)
            self.num_writes += 1
        if fault is None:
            super().pwrite(handle, offset, data)
        elif fault[0] == "error":
            raise OSError(fault[1], f"{os.strerror(fault[1])} (simulated write fault)")
        else:
            if fault[1] > 0:
                super().pwrite(handle, offset, as_bytes(data)[: fault[1]])
            self._crash()

    def fsync(self, handle: int) -> None:
        self._check_alive()
        super().fsync(handle)

    def close(self, handle: int) -> None:
        if not self.crashed:
            super().close(handle)

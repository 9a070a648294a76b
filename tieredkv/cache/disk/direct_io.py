"""The disk tier's I/O backend: positional file I/O that releases the GIL.

Each open file has a buffered descriptor and, where the filesystem accepts it, an O_DIRECT one.
A request goes through O_DIRECT when its offset, length and buffer address are all 4 KiB
aligned (the store's payload I/O), else through the page cache (headers, superblock). Linux
keeps the two coherent for the disjoint ranges the store uses. `os.preadv`/`os.pwrite` drop
the GIL for the whole system call, so several disk worker threads overlap.
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

"""A disk I/O backend for tests that fails, tears or "crashes" chosen writes and reads."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tieredkv.cache.disk.direct_io import Buffer, DiskIOBackend, as_bytes


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

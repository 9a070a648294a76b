"""Keep disk figures honest: drop the disk store from the page cache before timed rounds (so a
"disk" hit is never served from RAM), and measure this disk's sequential read bandwidth in the
same run (the limit a disk promotion is compared against)."""

from __future__ import annotations

import logging
import mmap
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

ALIGN_BYTES = 4096
CHUNK_BYTES = 32 * 2**20  # the disk store's default chunk size


def drop_page_cache(directory: Path) -> int:
    """Write back and evict every regular file under `directory` from the page cache; the
    number of bytes dropped. Dirty pages are flushed first (fdatasync), since DONTNEED keeps
    dirty pages. Safe while the server has the files open."""
    dropped = 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            log.warning("cannot open %s to drop it from the page cache: %s", path, exc)
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return dropped


def _open_direct(path: Path, flags: int) -> tuple[int, bool]:
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError:
            pass
    return os.open(path, flags), False


def disk_read_bandwidth(directory: Path, num_bytes: int = 256 * 2**20) -> dict:
    """Sequential read bytes/s of a fresh `num_bytes` file in `directory` (then deleted), read
    in CHUNK_BYTES requests, with O_DIRECT when the filesystem allows, else buffered after
    dropping the file from the page cache. Median of three passes."""
    num_bytes = max(num_bytes // CHUNK_BYTES, 1) * CHUNK_BYTES
    path = directory / ".tieredkv-bench-bandwidth"
    buffer = mmap.mmap(-1, CHUNK_BYTES)  # page-aligned: valid for O_DIRECT
    buffer.write(os.urandom(ALIGN_BYTES) * (CHUNK_BYTES // ALIGN_BYTES))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for offset in range(0, num_bytes, CHUNK_BYTES):
                os.pwrite(fd, buffer, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        passes = []
        direct = False
        for _ in range(3):
            drop_file(path)
            fd, direct = _open_direct(path, os.O_RDONLY)
            try:
                start = time.perf_counter()
                for offset in range(0, num_bytes, CHUNK_BYTES):
                    os.preadv(fd, [buffer], offset)
                passes.append(time.perf_counter() - start)
            finally:
                os.close(fd)
        seconds = sorted(passes)[1]
        return {"bytes_per_s": num_bytes / seconds, "bytes": num_bytes, "o_direct": direct}
    finally:
        buffer.close()
        path.unlink(missing_ok=True)


def drop_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

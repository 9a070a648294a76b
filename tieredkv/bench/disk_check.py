"""Keep disk figures honest: drop the disk store from the page cache before timed rounds (so a
"disk" hit is never served from RAM), and measure this disk's read bandwidth in the same run
(the limit a disk promotion is compared against) at the store's own request sizes and numbers
of requests in flight: `disk_read_limit`, the one probe every benchmark uses."""

from __future__ import annotations

import logging
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tieredkv.cache.disk.store import CHUNK_BYTES, IO_DEPTH, IO_THREADS, MIN_CHUNKS

log = logging.getLogger(__name__)

ALIGN_BYTES = 4096
# (request bytes, requests in flight) the store issues: whole chunks IO_DEPTH + 1 at a time (one
# transfer's pipeline), a staging buffer's quarter-chunks (a 32 MiB read splits into MIN_CHUNKS)
# and whole chunks on all IO_THREADS (transfers at once)
STORE_SHAPES = (
    (CHUNK_BYTES, IO_DEPTH + 1),
    (CHUNK_BYTES // MIN_CHUNKS, IO_THREADS),
    (CHUNK_BYTES, IO_THREADS),
)


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


def disk_read_bandwidth(
    directory: Path,
    num_bytes: int = 256 * 2**20,
    chunk_bytes: int = CHUNK_BYTES,
    in_flight: int = IO_DEPTH + 1,
) -> dict:
    """Read bytes/s of a fresh `num_bytes` file in `directory` (then deleted): `chunk_bytes`
    requests, `in_flight` of them at once on as many threads (the disk store's own request size
    and parallelism), with O_DIRECT when the filesystem allows, else buffered after dropping the
    file from the page cache. Median of three passes."""
    num_bytes = max(num_bytes // chunk_bytes, 1) * chunk_bytes
    path = directory / ".tieredkv-bench-bandwidth"
    buffers = [mmap.mmap(-1, chunk_bytes) for _ in range(in_flight)]  # page-aligned: O_DIRECT
    buffers[0].write(os.urandom(ALIGN_BYTES) * (chunk_bytes // ALIGN_BYTES))
    offsets = list(range(0, num_bytes, chunk_bytes))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for offset in offsets:
                os.pwrite(fd, buffers[0], offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        passes = []
        direct = False
        with ThreadPoolExecutor(in_flight, thread_name_prefix="tkv-disk-probe") as readers:
            for _ in range(3):
                drop_file(path)
                fd, direct = _open_direct(path, os.O_RDONLY)

                def read(worker: int, fd: int = fd) -> None:
                    for offset in offsets[worker::in_flight]:
                        os.preadv(fd, [buffers[worker]], offset)

                try:
                    start = time.perf_counter()
                    list(readers.map(read, range(in_flight)))
                    passes.append(time.perf_counter() - start)
                finally:
                    os.close(fd)
        seconds = sorted(passes)[1]
        return {
            "bytes_per_s": num_bytes / seconds,
            "bytes": num_bytes,
            "o_direct": direct,
            "chunk_bytes": chunk_bytes,
            "in_flight": in_flight,
        }
    finally:
        for buffer in buffers:
            buffer.close()
        path.unlink(missing_ok=True)


def disk_read_limit(directory: Path, num_bytes: int = 256 * 2**20) -> dict:
    """The disk's read limit for the store: the fastest of `disk_read_bandwidth` at each of
    STORE_SHAPES (a promotion may issue any of them); adds every shape's bytes/s."""
    probes = [
        disk_read_bandwidth(directory, num_bytes, chunk_bytes=c, in_flight=n)
        for c, n in STORE_SHAPES
    ]
    best = max(probes, key=lambda probe: probe["bytes_per_s"])
    return {**best, "shapes_bytes_per_s": [probe["bytes_per_s"] for probe in probes]}


def drop_file(path: Path) -> None:
    """Ask the kernel to forget `path`'s cached pages, so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

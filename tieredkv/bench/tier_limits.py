"""This machine's own limits, measured in the same run as the tiers they judge.

- memcpy: numpy `copyto` of a large buffer (the ceiling of any host<->device copy on a CPU-only
  machine, where the "device" is RAM too), on one thread (the limit the targets use) and split
  over two threads (the limit for copies that use two, as the transfer queue's larger jobs do);
- xxh3: the disk record checksum on one core (the store hashes every byte it moves);
- raw disk: O_DIRECT in-order write then read of one large file, dropped from the page cache
  (posix_fadvise DONTNEED) before it is read, for several request patterns (request size,
  requests in flight); the best pattern is the limit the store is compared with.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from tieredkv.bench.disk_check import drop_file
from tieredkv.cache.page_layout import aligned_empty

RAW_PATTERNS = ((64, 1), (256, 1), (8, 4), (32, 4))  # (request MiB, in flight); best = limit


def rep_seconds(
    run: Callable[[], object], reps: int, before: Callable[[], object] = lambda: None
) -> list[float]:
    """One warm-up, then the seconds of `reps` timed runs; `before` runs untimed each time."""
    times = []
    for rep in range(reps + 1):
        before()
        start = time.perf_counter()
        run()
        if rep:
            times.append(time.perf_counter() - start)
    return times


def median_seconds(
    run: Callable[[], object], reps: int, before: Callable[[], object] = lambda: None
) -> float:
    """The median of `rep_seconds`."""
    return statistics.median(rep_seconds(run, reps, before))


@dataclass(frozen=True)
class Rate:
    """GB/s of timed repetitions: the median one's, the slowest and the fastest."""

    gbps: float
    min_gbps: float
    max_gbps: float

    @classmethod
    def of(cls, num_bytes: float, seconds: list[float]) -> Rate:
        return cls(num_bytes / statistics.median(seconds) / 1e9,
                   num_bytes / max(seconds) / 1e9, num_bytes / min(seconds) / 1e9)  # fmt: skip


def memcpy_gbps(num_bytes: int, reps: int, rng: np.random.Generator, threads: int = 1) -> float:
    """One large numpy copy, split into `threads` equal slices copied at once (numpy releases
    the GIL), as GB/s of bytes copied."""
    src = rng.integers(0, 256, num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst.fill(0)  # fault the destination in: the copy, not the page faults, is timed
    cuts = [num_bytes * index // threads for index in range(threads + 1)]
    slices = [slice(start, end) for start, end in itertools.pairwise(cuts)]
    with ThreadPoolExecutor(threads) as pool:

        def copy() -> None:
            list(pool.map(lambda part: np.copyto(dst[part], src[part]), slices))

        seconds = median_seconds(copy, reps)
    return num_bytes / seconds / 1e9


def xxh3_gbps(num_bytes: int, reps: int, rng: np.random.Generator) -> float:
    """The record checksum's own speed on one core."""
    data = rng.integers(0, 256, num_bytes, dtype=np.uint8)
    seconds = median_seconds(lambda: xxhash.xxh3_64(data).intdigest(), reps)
    return num_bytes / seconds / 1e9


@dataclass(frozen=True)
class RawDiskResult:
    """O_DIRECT GB/s of one request pattern over one file."""

    request_mib: int
    in_flight: int
    write_gbps: float
    read_gbps: float


def raw_disk_gbps(
    path: Path,
    num_bytes: int,
    reps: int,
    rng: np.random.Generator,
    request_mib: int,
    in_flight: int,
) -> RawDiskResult:
    """O_DIRECT write (then fdatasync) and read of `num_bytes` at `path`, in order,
    `request_mib` MiB per request with `in_flight` requests at once (one thread each).
    Raises OSError where the filesystem refuses O_DIRECT."""
    request_bytes = min(request_mib << 20, num_bytes)
    buffers = [aligned_empty(request_bytes) for _ in range(in_flight)]
    for buffer in buffers:
        buffer[:] = rng.integers(0, 256, request_bytes, dtype=np.uint8)
    offsets = range(0, num_bytes, request_bytes)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    pool = ThreadPoolExecutor(in_flight)
    try:
        os.posix_fallocate(fd, 0, num_bytes)

        def each(action: Callable[[int, np.ndarray], object]) -> None:
            # thread i moves requests i, i + in_flight, ...: in order, `in_flight` at once
            def lane(lane_index: int) -> None:
                for offset in offsets[lane_index::in_flight]:
                    action(offset, buffers[lane_index])

            list(pool.map(lane, range(in_flight)))

        def write() -> None:
            each(lambda offset, buffer: os.pwrite(fd, buffer, offset))
            os.fdatasync(fd)

        write_s = median_seconds(write, reps)
        read_s = median_seconds(
            lambda: each(lambda offset, buffer: os.preadv(fd, [buffer], offset)),
            reps,
            lambda: drop_file(path),
        )
    finally:
        pool.shutdown()
        os.close(fd)
        path.unlink()
    return RawDiskResult(
        request_mib, in_flight, num_bytes / write_s / 1e9, num_bytes / read_s / 1e9
    )

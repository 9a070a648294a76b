"""Disk tier bandwidth beside this machine's own limits, measured in the same run.

    .venv/bin/python benchmarks/tier_bandwidth.py [--dir DIR] [--batches 64,256,1024]

Limits: a large numpy memcpy, xxh3 on one core, and O_DIRECT in-order write then read of a
file of --raw-bytes (>= 1 GiB by default), dropped from the page cache (posix_fadvise
DONTNEED) before it is read, in several request patterns (RAW_PATTERNS: request size, requests
in flight); the best pattern is the disk's limit the store is compared with.

Store: DiskStore.write_pages / read_pages of realistic pages (the default model in bf16: 30
layers, 3 kv heads, head_dim 64, page_size 16 = 368,640 B) in batches, from aligned host
memory, checksums included, for each --store-configs setting. Seeded random bytes, one
warm-up, medians of --reps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash

from tieredkv.cache.device_pool import PageLayout
from tieredkv.cache.disk_file import STORE_FILE
from tieredkv.cache.disk_io import aligned_empty
from tieredkv.cache.disk_store import DiskRecord, DiskStore
from tieredkv.cache.page_key import namespace_root_key, page_key

LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=torch.bfloat16)
REP_BYTES = 256 << 20  # store bytes moved per timed repetition, in batches
RAW_PATTERNS = ((64, 1), (256, 1), (8, 4), (32, 4))  # (request MiB, in flight); best = limit


def median_seconds(run: Callable[[], None], reps: int, before: Callable[[], None]) -> float:
    """One warm-up, then the median of `reps` timed runs; `before` runs untimed each time."""
    times = []
    for rep in range(reps + 1):
        before()
        start = time.perf_counter()
        run()
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def memcpy_gbps(num_bytes: int, reps: int, rng: np.random.Generator) -> float:
    src = rng.integers(0, 256, num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    seconds = median_seconds(lambda: np.copyto(dst, src), reps, lambda: None)
    return num_bytes / seconds / 1e9


def xxh3_gbps(num_bytes: int, reps: int, rng: np.random.Generator) -> float:
    """The record checksum's own speed on one core (the store hashes every byte it moves)."""
    data = rng.integers(0, 256, num_bytes, dtype=np.uint8)
    seconds = median_seconds(lambda: xxhash.xxh3_64(data).intdigest(), reps, lambda: None)
    return num_bytes / seconds / 1e9


def raw_disk_gbps(
    path: Path,
    num_bytes: int,
    reps: int,
    rng: np.random.Generator,
    request_bytes: int,
    queue_depth: int,
) -> tuple[float, float]:
    """O_DIRECT (write, read) GB/s over one large file, in order, `request_bytes` per request
    with `queue_depth` requests in flight (one thread each)."""
    buffers = [aligned_empty(request_bytes) for _ in range(queue_depth)]
    for buffer in buffers:
        buffer[:] = rng.integers(0, 256, request_bytes, dtype=np.uint8)
    offsets = range(0, num_bytes, request_bytes)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    pool = ThreadPoolExecutor(queue_depth)
    try:
        os.posix_fallocate(fd, 0, num_bytes)

        def each(action: Callable[[int, np.ndarray], object]) -> None:
            # thread i moves requests i, i + depth, ...: in order, `queue_depth` in flight
            def lane(lane_index: int) -> None:
                for offset in offsets[lane_index::queue_depth]:
                    action(offset, buffers[lane_index])

            list(pool.map(lane, range(queue_depth)))

        def write() -> None:
            each(lambda offset, buffer: os.pwrite(fd, buffer, offset))
            os.fdatasync(fd)

        write_s = median_seconds(write, reps, lambda: None)
        read_s = median_seconds(
            lambda: each(lambda offset, buffer: os.preadv(fd, [buffer], offset)),
            reps,
            lambda: drop_cache(path),
        )
    finally:
        pool.shutdown()
        os.close(fd)
        path.unlink()
    return num_bytes / write_s / 1e9, num_bytes / read_s / 1e9


def make_records(count: int) -> list[DiskRecord]:
    parent = namespace_root_key(b"bench", "bench")
    records = []
    for index in range(count):
        tokens = tuple(range(index * LAYOUT.page_size, (index + 1) * LAYOUT.page_size))
        key = page_key(parent, tokens)
        records.append(DiskRecord(key, parent, tokens))
        parent = key
    return records


def aligned_pages(count: int) -> torch.Tensor:
    """(count, *page_shape) bf16 in page-aligned host memory, as a pinned host pool would be."""
    flat = torch.from_numpy(aligned_empty(count * LAYOUT.page_bytes))
    return flat.view(LAYOUT.dtype).view(count, *LAYOUT.page_shape)


def store_gbps(
    store: DiskStore, data: torch.Tensor, batch: int, threads: int, reps: int
) -> tuple[float, float, bool]:
    """(write, read) GB/s of batches of `batch` pages, each split evenly over `threads` disk
    workers (one write_pages / read_pages call each, as the mover's disk pool would issue
    them); and whether every page read back verified and equal.

    The batches walk through the whole store (as large as the raw test file) in slot order,
    REP_BYTES per timed repetition, so the store is measured over the same span of disk as
    the raw limit. `data` (num_slots, *page_shape) holds a distinct random page per slot."""
    num_groups = store.num_slots // batch
    per_rep = max(REP_BYTES // (batch * LAYOUT.page_bytes), 1)
    records = make_records(batch)
    slots = store.alloc(num_groups * batch)  # a fresh store: slots 0, 1, 2, ... in order
    out = aligned_pages(num_groups * batch)
    out.view(torch.uint8).numpy().fill(0)  # fault the memory in, as a host pool's already is
    parts = [slice(batch * i // threads, batch * (i + 1) // threads) for i in range(threads)]
    verified: list[bool] = []
    pool = ThreadPoolExecutor(threads)
    cursor = 0

    def write(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        store.write_pages(slots[at], records[part], data[at])

    def read(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        verified.extend(store.read_pages(slots[at], records[part], out[at]))

    def move(transfer: Callable[[int, slice], None], groups: int) -> None:
        nonlocal cursor
        for _ in range(groups):
            group = cursor % num_groups
            cursor += 1
            list(pool.map(lambda part, g=group: transfer(g, part), parts))

    move(write, num_groups)  # fill the store once, untimed, as the raw test's warm-up does
    write_s = median_seconds(lambda: move(write, per_rep), reps, lambda: None)
    cursor = 0
    read_s = median_seconds(
        lambda: move(read, per_rep), reps, lambda: drop_cache(store.directory / STORE_FILE)
    )
    pool.shutdown()
    store.free(slots)
    read_groups = min((reps + 1) * per_rep, num_groups) * batch
    ok = all(verified) and torch.equal(
        data[:read_groups].view(torch.int16), out[:read_groups].view(torch.int16)
    )
    moved = per_rep * batch * LAYOUT.page_bytes
    return moved / write_s / 1e9, moved / read_s / 1e9, ok


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="a directory on the disk to test")
    parser.add_argument("--raw-bytes", type=int, default=1 << 30)
    parser.add_argument("--memcpy-bytes", type=int, default=512 << 20)
    parser.add_argument("--batches", default="64,256,1024")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store-configs",
        default="4:2:32",
        help="comma-separated DiskStore io_threads:io_depth:chunk_MiB settings to compare",
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    batches = [int(b) for b in args.batches.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tieredkv-bench-") as tmp:
        directory = Path(tmp)
        memcpy = memcpy_gbps(args.memcpy_bytes, args.reps, rng)
        xxh3 = xxh3_gbps(args.memcpy_bytes, args.reps, rng)
        raw = {
            (request_mib, depth): raw_disk_gbps(
                directory / "raw.bin", args.raw_bytes, args.reps, rng, request_mib << 20, depth
            )
            for request_mib, depth in RAW_PATTERNS
        }
        raw_write = max(write for write, _ in raw.values())  # the machine's limit: best pattern
        raw_read = max(read for _, read in raw.values())
        # the store spans as much disk as the raw test file (and at least two largest batches)
        capacity = max(args.raw_bytes, 2 * max(batches) * LAYOUT.page_bytes) + (16 << 20)
        data: torch.Tensor | None = None
        print(
            f"{len(os.sched_getaffinity(0))} CPUs usable, page {LAYOUT.page_bytes:,} B, "
            f"seed {args.seed}, medians of {args.reps} after 1 warm-up"
        )
        print(f"{'what':<40}{'write GB/s':>11}{'read GB/s':>11}{'w/raw':>7}{'r/raw':>7}")
        print(f"{'numpy memcpy':<40}{memcpy:>11.2f}{memcpy:>11.2f}")
        print(f"{'xxh3_64, one core':<40}{xxh3:>11.2f}{xxh3:>11.2f}")
        for (request_mib, depth), (write, read) in raw.items():
            label = f"raw O_DIRECT, {request_mib} MiB x {depth} in flight"
            print(f"{label:<40}{write:>11.2f}{read:>11.2f}")
        for config in args.store_configs.split(","):
            io_threads, io_depth, chunk_mib = (int(part) for part in config.split(":"))
            store = DiskStore(
                directory / "store",
                b"bench",
                LAYOUT,
                capacity,
                io_threads=io_threads,
                io_depth=io_depth,
                chunk_bytes=chunk_mib << 20,
            )
            direct = "O_DIRECT" if store.direct_io else "buffered"
            if data is None:  # a distinct random page per slot: (num_slots, *page_shape) bf16
                data = aligned_pages(store.num_slots)
                data.view(torch.uint8).numpy().reshape(-1)[:] = np.frombuffer(
                    rng.bytes(data.numel() * 2), dtype=np.uint8
                )
            for threads in thread_counts:
                for batch in batches:
                    write, read, ok = store_gbps(store, data, batch, threads, args.reps)
                    label = f"store {config} {direct} {batch}p x{threads}" + ("" if ok else " BAD")
                    print(
                        f"{label:<40}{write:>11.2f}{read:>11.2f}"
                        f"{write / raw_write:>7.0%}{read / raw_read:>7.0%}"
                    )
            store.close()


if __name__ == "__main__":
    main()

"""Disk tier bandwidth beside this machine's own limits, measured in the same run.

    .venv/bin/python benchmarks/tier_bandwidth.py [--dir DIR] [--batches 64,256,1024]

Limits: a large numpy memcpy, and O_DIRECT sequential write then read of a file of
--raw-bytes (>= 1 GiB by default), dropped from the page cache (posix_fadvise DONTNEED) before
it is read. Store: DiskStore.write_pages / read_pages of realistic pages (the default model in
bf16: 30 layers, 3 kv heads, head_dim 64, page_size 16 = 368,640 B) in batches, from aligned
host memory, checksums included. Seeded random bytes, one warm-up, medians of --reps.
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
CHUNK_BYTES = 64 << 20


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


def raw_disk_gbps(path: Path, num_bytes: int, reps: int, rng: np.random.Generator):
    """O_DIRECT sequential (write, read) GB/s of one large file in CHUNK_BYTES requests."""
    buffer = aligned_empty(CHUNK_BYTES)
    buffer[:] = rng.integers(0, 256, CHUNK_BYTES, dtype=np.uint8)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        os.posix_fallocate(fd, 0, num_bytes)

        def write() -> None:
            for offset in range(0, num_bytes, CHUNK_BYTES):
                os.pwrite(fd, buffer, offset)
            os.fdatasync(fd)

        def read() -> None:
            for offset in range(0, num_bytes, CHUNK_BYTES):
                os.preadv(fd, [buffer], offset)

        write_s = median_seconds(write, reps, lambda: None)
        read_s = median_seconds(read, reps, lambda: drop_cache(path))
    finally:
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
    store: DiskStore, batch: int, threads: int, reps: int, rng: np.random.Generator
) -> tuple[float, float, bool]:
    """(write, read) GB/s of one `batch`-page transfer split evenly over `threads` disk
    workers (one write_pages / read_pages call each, as the mover's disk pool would issue
    them); and whether every page read back verified and equal."""
    pages = aligned_pages(batch)  # (batch, *page_shape) bf16
    pages.view(torch.uint8).numpy().reshape(-1)[:] = rng.integers(
        0, 256, pages.numel() * 2, np.uint8
    )
    out = aligned_pages(batch)
    records = make_records(batch)
    slots = store.alloc(batch)
    parts = [range(batch * i // threads, batch * (i + 1) // threads) for i in range(threads)]
    verified: list[list[bool]] = []
    pool = ThreadPoolExecutor(threads)

    def write_part(part: range) -> None:
        store.write_pages(
            slots[part.start : part.stop],
            records[part.start : part.stop],
            pages[part.start : part.stop],
        )

    def read_part(part: range) -> list[bool]:
        return store.read_pages(
            slots[part.start : part.stop],
            records[part.start : part.stop],
            out[part.start : part.stop],
        )

    write_s = median_seconds(lambda: list(pool.map(write_part, parts)), reps, lambda: None)
    read_s = median_seconds(
        lambda: verified.extend(pool.map(read_part, parts)),
        reps,
        lambda: drop_cache(store.directory / STORE_FILE),
    )
    pool.shutdown()
    store.free(slots)
    ok = all(all(v) for v in verified) and torch.equal(
        pages.view(torch.int16), out.view(torch.int16)
    )
    moved = batch * LAYOUT.page_bytes
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
        default="2:1:8",
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
        raw_write, raw_read = raw_disk_gbps(directory / "raw.bin", args.raw_bytes, args.reps, rng)
        capacity = (max(batches) + 16) * (LAYOUT.page_bytes + 128) + (1 << 20)
        print(
            f"{len(os.sched_getaffinity(0))} CPUs usable, page {LAYOUT.page_bytes:,} B, "
            f"seed {args.seed}, medians of {args.reps} after 1 warm-up"
        )
        print(f"{'what':<40}{'write GB/s':>11}{'read GB/s':>11}{'w/raw':>7}{'r/raw':>7}")
        print(f"{'numpy memcpy':<40}{memcpy:>11.2f}{memcpy:>11.2f}")
        print(f"{'xxh3_64, one core':<40}{xxh3:>11.2f}{xxh3:>11.2f}")
        print(
            f"{'raw O_DIRECT sequential, 64 MiB requests':<40}{raw_write:>11.2f}{raw_read:>11.2f}"
        )
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
            for threads in thread_counts:
                for batch in batches:
                    write, read, ok = store_gbps(store, batch, threads, args.reps, rng)
                    label = f"store {config} {direct} {batch}p x{threads}" + ("" if ok else " BAD")
                    print(
                        f"{label:<40}{write:>11.2f}{read:>11.2f}"
                        f"{write / raw_write:>7.0%}{read / raw_read:>7.0%}"
                    )
            store.close()


if __name__ == "__main__":
    main()

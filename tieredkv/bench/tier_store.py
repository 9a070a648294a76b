"""The disk store on its own: DiskStore.write_pages / read_pages from aligned host memory.

Realistic pages (`LAYOUT`: the default model, SmolLM2-135M, in bf16 at its default page size:
30 layers x 2 x 3 kv heads x 64 x 2 B x 16 = 368,640 B) in batches walk through the whole
store in slot order, `REP_BYTES` per timed repetition, so the store is measured over the same
span of disk as the raw limit. Checksums included; every page read back is verified and
compared with what was written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from tieredkv.bench.disk_check import drop_file
from tieredkv.bench.tier_limits import Rate, rep_seconds
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.store import DiskRecord, DiskStore
from tieredkv.cache.index.page_key import namespace_root_key, page_key
from tieredkv.cache.page_layout import PageLayout, aligned_empty

LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=torch.bfloat16)
REP_BYTES = 256 << 20  # bytes moved per timed repetition, in batches


def make_records(count: int) -> list[DiskRecord]:
    """`count` chained page records (one conversation's pages, in order)."""
    parent = namespace_root_key(b"bench", "bench")
    records = []
    for index in range(count):
        tokens = tuple(range(index * LAYOUT.page_size, (index + 1) * LAYOUT.page_size))
        key = page_key(parent, tokens)
        records.append(DiskRecord(key, parent, tokens))
        parent = key
    return records


def aligned_pages(count: int) -> torch.Tensor:
    """(count, *page_shape) bf16 in page-aligned host memory, faulted in."""
    flat = aligned_empty(count * LAYOUT.page_bytes)
    flat.fill(0)
    return torch.from_numpy(flat).view(LAYOUT.dtype).view(count, *LAYOUT.page_shape)


def random_pages(count: int, rng: np.random.Generator) -> torch.Tensor:
    """`aligned_pages(count)` holding seeded random bytes (a distinct page per slot)."""
    pages = aligned_pages(count)
    pages.view(torch.uint8).numpy().reshape(-1)[:] = np.frombuffer(
        rng.bytes(pages.numel() * 2), dtype=np.uint8
    )
    return pages


def span_gbps(
    num_groups: int,
    batch: int,
    reps: int,
    write_group: Callable[[int], object],
    read_group: Callable[[int], object],
    before_read: Callable[[], object],
) -> tuple[Rate, Rate]:
    """(write, read) GB/s of batches of `batch` pages over `num_groups` consecutive slot groups.

    Every group is written once untimed (a full store, as the raw test's warm-up leaves its
    file); each timed repetition then moves the next REP_BYTES worth of groups in order."""
    per_rep = max(REP_BYTES // (batch * LAYOUT.page_bytes), 1)
    cursor = itertools.count()

    def move(transfer: Callable[[int], object]) -> None:
        for _ in range(per_rep):
            transfer(next(cursor) % num_groups)

    for group in range(num_groups):
        write_group(group)
    write_s = rep_seconds(lambda: move(write_group), reps)
    cursor = itertools.count()
    read_s = rep_seconds(lambda: move(read_group), reps, before_read)
    moved = per_rep * batch * LAYOUT.page_bytes
    return Rate.of(moved, write_s), Rate.of(moved, read_s)


def store_gbps(
    store: DiskStore, data: torch.Tensor, batch: int, threads: int, reps: int
) -> tuple[Rate, Rate, bool]:
    """(write, read) GB/s of batches of `batch` pages, each split evenly over `threads` disk
    workers (one write_pages / read_pages call each, as the mover's disk pool issues them),
    and whether every page read back verified and equal. `data` (num_pages, *page_shape)."""
    num_groups = store.num_pages // batch
    records = make_records(batch)
    slots = store.alloc(num_groups * batch)  # a fresh store: slots 0, 1, 2, ... in order
    out = aligned_pages(num_groups * batch)
    parts = [slice(batch * i // threads, batch * (i + 1) // threads) for i in range(threads)]
    verified: list[bool] = []
    pool = ThreadPoolExecutor(threads)

    def write_part(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        store.write_pages(slots[at], records[part], data[at])

    def read_part(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        verified.extend(store.read_pages(slots[at], records[part], out[at]))

    def on_pool(transfer: Callable[[int, slice], None]) -> Callable[[int], object]:
        return lambda group: list(pool.map(lambda part: transfer(group, part), parts))

    try:
        write, read = span_gbps(
            num_groups,
            batch,
            reps,
            on_pool(write_part),
            on_pool(read_part),
            lambda: drop_file(store.directory / STORE_FILE),
        )
    finally:
        pool.shutdown()
        store.free(slots)
    read_groups = min((reps + 1) * max(REP_BYTES // (batch * LAYOUT.page_bytes), 1), num_groups)
    checked = read_groups * batch  # the groups the timed reads filled, from group 0 on
    ok = all(verified) and torch.equal(
        data[:checked].view(torch.int16), out[:checked].view(torch.int16)
    )
    return write, read, ok

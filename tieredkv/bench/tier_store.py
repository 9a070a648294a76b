"""The pages and the disk span the tier copies are measured on.

Realistic pages (`LAYOUT`: the default model, SmolLM2-135M, in bf16 at its default page size:
30 layers x 2 x 3 kv heads x 64 x 2 B x 16 = 368,640 B) in batches walk through the whole
store in slot order, `REP_BYTES` per timed repetition, so the store is measured over the same
span of disk as the raw limit. Checksums included.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from tieredkv.bench.tier_limits import Rate, rep_seconds
from tieredkv.cache.index.page_key import namespace_root_key, page_key
from tieredkv.cache.page_layout import PageLayout, aligned_empty
from tieredkv.cache.page_record import PageRecord

LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=torch.bfloat16)
REP_BYTES = 256 << 20  # bytes moved per timed repetition, in batches


def make_records(count: int) -> list[PageRecord]:
    """`count` chained page records (one conversation's pages, in order)."""
    parent = namespace_root_key(b"bench", "bench")
    records = []
    for index in range(count):
        tokens = tuple(range(index * LAYOUT.page_size, (index + 1) * LAYOUT.page_size))
        key = page_key(parent, tokens)
        records.append(PageRecord(key, parent, tokens))
        parent = key
    return records


def aligned_pages(count: int) -> torch.Tensor:
    """(count, *page_shape) bf16 in page-aligned host memory, faulted in."""
    flat = aligned_empty(count * LAYOUT.page_bytes)
    flat.fill(0)
    return torch.from_numpy(flat).view(LAYOUT.dtype).view(count, *LAYOUT.page_shape)


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

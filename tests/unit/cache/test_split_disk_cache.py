"""A split disk store in the tiered cache: a copy written to disk records its pages' sliding
layers only where the rule keeps them, the same bytes hold more history, a warm restart finds
each page with what it kept, and reads bring the pages back verified."""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from tests.support.fault_io import FaultInjectingIO
from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import device_page, expected_pages, make_cache
from tests.unit.cache.cache_steps import compute, ok, settle
from tests.unit.cache.test_sliding_gaps import LAYOUT, WINDOW, model
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.split_store import SplitDiskStore
from tieredkv.cache.index.match_results import MatchResult
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import WritePolicy

FULL_LAYER, SLIDING_LAYER = 1, 0  # the tiny model's layers


def disk_cache(
    directory: Path, disk_pages: int, policy: WritePolicy = WritePolicy.WRITE_BACK
) -> tuple[TieredCache, ManualTransferExecutor, SplitDiskStore]:
    """A device over a split disk store with the bytes of `disk_pages` whole pages' layer
    records (two a page: one sliding layer, one full)."""
    cache, executor = make_cache(
        LAYOUT, device_pages=32, disk_pages=disk_pages, disk_dir=directory,
        model=model(WINDOW), split_disk=True, write_policy=policy,
    )  # fmt: skip
    disk = cache.pools.disk
    assert isinstance(disk, SplitDiskStore) and disk.num_units == 2 * disk_pages
    return cache, executor, disk


def chat(first: int, num_tokens: int = 40) -> list[int]:
    return list(range(first, first + num_tokens))


def disk_copy(cache: TieredCache, tokens: list[int]) -> tuple[list[int] | None, frozenset[int]]:
    record = cache.match([*tokens, 1]).last_node.residence
    return record.copies.get(Tier.DISK), record.sliding_gaps.get(Tier.DISK, frozenset())


def disk_gaps(match: MatchResult) -> set[int]:
    """The indexes in the path of the disk pages whose copy lacks the sliding part."""
    gaps: set[int] = set()
    first = 0
    for node in match.disk.nodes:
        gaps.update(first + index for index in node.residence.sliding_gaps.get(Tier.DISK, ()))
        first += node.num_pages
    return gaps


def promote_and_check(cache: TieredCache, executor: ManualTransferExecutor, tokens: list[int]):
    """Promote `tokens`' match from disk; every page's full layer, and the sliding layer of
    each page its copy holds, comes back with the bytes inserted."""
    match = cache.match([*tokens, 1])
    assert match.disk.num_pages == len(tokens) // LAYOUT.page_size
    gaps = disk_gaps(match)
    cache.lock(match.last_node)
    while (ticket := cache.promote(match)) is None:
        settle(cache, executor)
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == match.num_pages
    wanted = expected_pages(tokens, "default", LAYOUT)
    for index, (page, want) in enumerate(zip(ticket.device_pages, wanted, strict=True)):
        got = device_page(cache, page)
        assert torch.equal(got[FULL_LAYER], want[FULL_LAYER])
        if index not in gaps:
            assert torch.equal(got[SLIDING_LAYER], want[SLIDING_LAYER])
    cache.unlock(match.last_node)
    ok(cache)


def test_a_disk_copy_records_the_sliding_layers_of_its_window_only(tmp_path: Path) -> None:
    cache, executor, disk = disk_cache(tmp_path, disk_pages=20)
    history = chat(100)
    compute(cache, history)
    cache.evict(Tier.DEVICE, 32)  # down to disk, written from the device copy
    settle(cache, executor)
    pages, gaps = disk_copy(cache, history)
    assert pages is not None and len(pages) == 10 and gaps == frozenset(range(6))
    assert cache.tier_parts_held(Tier.DISK) == (10, 4)
    assert disk.num_free == disk.num_units - 14  # ten full layers, four sliding ones
    assert cache.match([*history, 1]).matched_len == 40  # its end kept its window
    assert cache.match([*history[:24], 7, 7]).matched_len == 0  # no window before the end
    promote_and_check(cache, executor, history)
    cache.close()


def test_the_same_bytes_hold_more_history_than_whole_page_records(tmp_path: Path) -> None:
    cache, executor, _ = disk_cache(tmp_path, disk_pages=35, policy=WritePolicy.WRITE_THROUGH)
    chats = [chat(1000 * (i + 1)) for i in range(5)]  # 10 pages each, 4 in the window
    for tokens in chats:
        compute(cache, tokens)
        settle(cache, executor)
        cache.evict(Tier.DEVICE, 32)
        settle(cache, executor)
    assert cache.tier_parts_held(Tier.DISK) == (50, 20)  # five chats where 3.5 fit whole
    for tokens in chats:
        assert cache.match([*tokens, 1]).disk.num_pages == 10
    cache.close()


def test_a_warm_restart_finds_what_each_page_kept(tmp_path: Path) -> None:
    cache, executor, _ = disk_cache(tmp_path, disk_pages=40, policy=WritePolicy.WRITE_THROUGH)
    turn1 = chat(100)
    compute(cache, turn1)
    settle(cache, executor)
    turn2 = [*turn1, *chat(300)]
    compute(cache, turn2)
    settle(cache, executor)
    room = cache.demoter.transfers.sliding_rooms[Tier.DISK]
    assert room.reclaim() == 4  # turn 1's end is the middle of the path now
    assert cache.tier_parts_held(Tier.DISK) == (20, 4)
    cache.close()
    cache, executor, _ = disk_cache(tmp_path, disk_pages=40)
    assert cache.tier_parts_held(Tier.DISK) == (20, 4)  # the reclaimed parts' records are gone
    match = cache.match([*turn2, 1])
    assert match.matched_len == 80 and match.disk.num_pages == 20
    assert disk_gaps(match) == set(range(16))  # only the path's end kept its window
    assert cache.match([*turn1, 7, 7]).matched_len == 0  # turn 1's end: cut
    promote_and_check(cache, executor, turn2)
    cache.close()


def test_a_full_disk_degrades_the_tier_and_keeps_the_device_copy(tmp_path: Path) -> None:
    io = FaultInjectingIO(direct_io=False)
    cache, executor = make_cache(
        LAYOUT, device_pages=32, disk_pages=20, disk_dir=tmp_path, disk_io=io,
        model=model(WINDOW), split_disk=True,
    )  # fmt: skip
    history = chat(100)
    compute(cache, history)
    io.fail_write(errno.ENOSPC)
    cache.evict(Tier.DEVICE, 32)  # the demotion's write fails
    settle(cache, executor)
    assert not cache.tier_healthy(Tier.DISK)
    assert cache.disk_page_errors()[DiskErrorReason.IO] >= 1
    assert cache.tier_used_bytes(Tier.DISK) == 0  # the failed copy's layer records freed
    assert cache.match([*history, 1]).device.num_pages == 10  # nothing computed was lost
    ok(cache)
    cache.close()

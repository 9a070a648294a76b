"""The disk tier in the tiered cache: warm restart, and a full or read-only disk."""

import errno
from pathlib import Path

import pytest
import torch

from tests.support.fault_io import FaultInjectingIO
from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import (
    FINGERPRINT,
    device_page,
    disk_bytes_for,
    expected_pages,
    make_cache,
    tiny_layout,
)
from tests.unit.cache.cache_steps import ok, settle
from tieredkv.cache.build import build_cache
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig, WritePolicy

LAYOUT = tiny_layout(page_size=4)
SYSTEM = list(range(1000, 1008))  # a 2-page shared system prompt


def request(cache: TieredCache, executor: ManualTransferExecutor, tokens: list[int]) -> None:
    """Reuse the device segment of the match, compute and insert the rest."""
    match = cache.match(tokens)
    reused = list(match.device.pages)
    if reused:
        cache.lock(match.device.nodes[-1])
    needed = len(tokens) // LAYOUT.page_size - len(reused)
    while (pages := cache.allocate(needed)) is None:
        assert executor.pending(), "no room and nothing in flight"
        settle(cache, executor)
    for page, contents in zip(
        pages, expected_pages(tokens, "default", LAYOUT)[len(reused) :], strict=False
    ):
        cache.device_pool.kv[:, :, page] = contents
    result = cache.insert(tokens, "default", reused + pages)
    cache.free([p for p in pages if p not in result.device_pages])
    if reused:
        cache.unlock(match.device.nodes[-1])
    ok(cache)


def promote_and_check(cache: TieredCache, executor: ManualTransferExecutor, tokens: list[int]):
    match = cache.match(tokens)
    cache.lock(match.last_node)
    while (ticket := cache.promote(match)) is None:
        settle(cache, executor)
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == match.num_pages
    for page, want in zip(
        ticket.device_pages, expected_pages(tokens, "default", LAYOUT), strict=False
    ):
        assert torch.equal(device_page(cache, page), want)
    cache.unlock(match.last_node)
    ok(cache)
    return match


def conversation(i: int) -> list[int]:
    return SYSTEM + [i] * 8 + [0]  # system prompt, two pages of its own, one partial token


def test_warm_restart_matches_demoted_conversations_on_disk(tmp_path: Path) -> None:
    cache, executor = make_cache(LAYOUT, 6, 4, 64, tmp_path)
    for i in range(8):
        request(cache, executor, conversation(i))
    settle(cache, executor)
    shared = cache.match([*SYSTEM, 0])
    assert shared.device.num_pages == 2  # the hot prefix stays on the device...
    assert all(
        Tier.DISK in n.residence.copies for n in shared.device.nodes
    )  # ...and has its disk copy
    on_disk = [i for i in range(8) if cache.match(conversation(i)).disk.num_pages == 2]
    assert len(on_disk) >= 4
    cache.close()

    cache, executor = make_cache(LAYOUT, 6, 4, 64, tmp_path)
    ok(cache)
    for i in on_disk:
        match = promote_and_check(cache, executor, conversation(i))
        assert match.matched_len == 16
    assert cache.counters.hit_tokens[Tier.DISK] > 0
    assert cache.match(conversation(99)).matched_len == 8  # the system prompt
    cache.close()


def test_restart_with_threads_and_another_namespace(tmp_path: Path) -> None:
    """Real worker threads; the engine waits on the transfer queue's condition, never sleeps."""
    config = CacheConfig(
        page_size=4,
        device_cache_bytes=4 * LAYOUT.page_bytes,
        host_cache_bytes=0,
        disk_cache_dir=tmp_path,
        disk_cache_bytes=disk_bytes_for(LAYOUT, 16),
    )
    cache = build_cache(config, LAYOUT, FINGERPRINT)
    tokens = list(range(17))
    pages = cache.allocate(4)
    assert pages is not None
    for page, contents in zip(pages, expected_pages(tokens, "tenant", LAYOUT), strict=False):
        cache.device_pool.kv[:, :, page] = contents
    cache.insert(tokens, "tenant", pages)
    while (other := cache.allocate(4)) is None:
        cache.wait(timeout=10)
    cache.free(other)
    assert cache.match(tokens, "tenant").disk.num_pages == 4
    cache.close()

    cache = build_cache(config, LAYOUT, FINGERPRINT)
    assert cache.match(tokens, "default").matched_len == 0
    match = cache.match(tokens, "tenant")
    assert match.disk.num_pages == 4
    ticket = cache.promote(match)
    assert ticket is not None
    while not ticket.done:
        cache.wait(timeout=10)
    assert ticket.num_ready_pages == 4 and ticket.tokens_by_tier[Tier.DISK] == 16
    assert ticket.completed_at is not None and ticket.completed_at >= ticket.created_at
    for page, want in zip(
        ticket.device_pages, expected_pages(tokens, "tenant", LAYOUT), strict=False
    ):
        assert torch.equal(device_page(cache, page), want)
    ok(cache)
    cache.close()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_unwritable_disk_degrades_and_keeps_host_pages(tmp_path: Path, error: int) -> None:
    io = FaultInjectingIO(direct_io=False)
    cache, executor = make_cache(LAYOUT, 4, 4, 16, tmp_path, disk_io=io)
    first, second, third = ([i] * 16 + [0] for i in range(1, 4))
    request(cache, executor, first)
    request(cache, executor, second)  # the first one is demoted to host
    settle(cache, executor)
    assert cache.match(first).host.num_pages == 4
    io.fail_write(error)
    io.fail_write(error, after=1)
    assert cache.allocate(4) is None  # host is full: the first one starts moving to disk
    settle(cache, executor)  # ...and the write fails
    assert not cache.tier_healthy(Tier.DISK) and cache.tier_healthy(Tier.HOST)
    assert cache.disk_page_errors()[DiskErrorReason.IO] >= 1
    assert cache.tier_used_bytes(Tier.DISK) == 0  # the failed destination was freed
    # nothing on device or host was lost
    on_host, on_device = cache.match(first).host, cache.match(second).device
    assert on_host.num_pages == 4 and on_device.num_pages == 4
    for page, want in zip(on_host.pages, expected_pages(first, "default", LAYOUT), strict=False):
        assert torch.equal(cache.host_pool.kv[page], want)
    for page, want in zip(on_device.pages, expected_pages(second, "default", LAYOUT), strict=False):
        assert torch.equal(device_page(cache, page), want)
    # with the disk degraded, demotion from host becomes a drop; the rest keeps working
    request(cache, executor, third)
    settle(cache, executor)
    assert cache.counters.evicted_pages[Tier.HOST, "dropped"] == 4  # the first one
    assert cache.match(first).matched_len == 0
    assert cache.match(second).host.num_pages == 4  # demoted to host, not dropped
    promote_and_check(cache, executor, third)
    ok(cache)
    cache.close()


def test_write_through_writes_the_disk_from_the_host_copy(tmp_path: Path) -> None:
    """A page with device and host copies goes to disk from host; its record still verifies
    and serves the computed bytes after a restart."""
    cache, executor = make_cache(LAYOUT, 6, 4, 64, tmp_path, write_policy=WritePolicy.WRITE_THROUGH)
    tokens = conversation(1)
    request(cache, executor, tokens)
    assert [(t.src_tier, t.dst_tier) for t in executor.pending()] == [(Tier.DEVICE, Tier.HOST)]
    executor.complete_all()
    cache.poll()
    assert [(t.src_tier, t.dst_tier) for t in executor.pending()] == [(Tier.HOST, Tier.DISK)]
    settle(cache, executor)
    page_bytes = LAYOUT.page_bytes
    assert cache.counters.transfer_bytes[Tier.HOST, Tier.DISK] == 4 * page_bytes
    assert cache.counters.transfer_bytes[Tier.DEVICE, Tier.DISK] == 0
    cache.close()

    cache, executor = make_cache(LAYOUT, 6, 4, 64, tmp_path)
    match = promote_and_check(cache, executor, tokens)
    assert match.disk.num_pages == 4
    cache.close()

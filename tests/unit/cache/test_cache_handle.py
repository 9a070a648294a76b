"""`CacheHandle`: a request's life through its handle (look up, prefetch, promote, reserve,
insert, release) on a real cache with manual transfers; check_integrity after every call."""

from __future__ import annotations

import torch

from tests.support.tiny_cache import (
    device_page,
    expected_pages,
    fill_device_pages,
    make_cache,
    tiny_layout,
)
from tests.unit.cache.cache_steps import ok, settle
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache

LAYOUT = tiny_layout(page_size=4)
NAMESPACE = "default"


def run_request(cache: TieredCache, tokens: list[int]) -> CacheHandle:
    """Admit, compute every full page of `tokens` and insert them, still holding the handle."""
    handle = CacheHandle(cache, NAMESPACE)
    assert handle.promote(tokens) and not handle.promotion_pending
    assert handle.take_promotion() is not None
    assert handle.reserve(len(tokens))
    fill_device_pages(cache, tokens, NAMESPACE, handle.page_table)  # the same bytes if cached
    handle.insert(tokens)
    ok(cache)
    return handle


def test_a_handle_inserts_its_pages_and_the_next_one_reuses_them() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(10))
    first = run_request(cache, tokens)
    assert first.num_tree_pages == 2 and len(first.page_table) == 3  # 10 tokens: 2 full pages
    second = CacheHandle(cache, NAMESPACE)
    second.look_up(tokens)
    assert second.matched_tokens_by_tier == {**dict.fromkeys(Tier, 0), Tier.DEVICE: 8}
    assert second.promote(tokens)
    result = second.take_promotion()
    assert result is not None and result.num_tokens == 8
    assert result.tokens_by_tier[Tier.DEVICE] == 8
    assert second.page_table == first.page_table[:2]  # the tree's pages, shared
    ok(cache)
    assert cache.num_locks() == 2
    first.release()
    second.release()
    ok(cache)
    assert cache.num_locks() == 0 and first.page_table == second.page_table == []
    assert cache.device_pool.num_free == 8 - 2  # the tree keeps the two full pages


def test_pages_computed_twice_are_freed_for_the_trees() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(9))
    early, late = CacheHandle(cache, NAMESPACE), CacheHandle(cache, NAMESPACE)
    for handle in (early, late):  # both admitted before either inserted
        assert handle.promote(tokens)
        handle.take_promotion()
        assert handle.reserve(len(tokens))
    early.insert(tokens[:8])
    late_private = list(late.page_table)
    late.insert(tokens[:8])
    ok(cache)
    assert late.page_table[:2] == early.page_table[:2] != late_private[:2]
    assert late.page_table[2] == late_private[2] and late.num_tree_pages == 2
    assert cache.device_pool.num_free == 8 - 3 - 1  # early's 3, late's last one
    early.release()
    late.release()
    ok(cache)


def test_a_promotion_from_host_is_pending_until_its_copy_is_applied() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(9))
    run_request(cache, tokens).release()
    assert cache.evict(Tier.DEVICE, 4) is False  # the demotion is in flight
    assert cache.transfers_in_flight() == 1
    settle(cache, executor)
    handle = CacheHandle(cache, NAMESPACE)
    handle.look_up(tokens)
    assert handle.matched_tokens_by_tier[Tier.HOST] == 8
    assert handle.promote(tokens) and handle.promotion_pending
    ok(cache)
    settle(cache, executor)
    assert not handle.promotion_pending
    result = handle.take_promotion()
    assert result is not None and result.tokens_by_tier[Tier.HOST] == 8
    assert result.seconds is not None
    want = expected_pages(tokens, NAMESPACE, LAYOUT)
    held = [device_page(cache, page) for page in handle.page_table]
    assert len(held) == len(want) == 2 and all(map(torch.equal, held, want))
    handle.release()
    ok(cache)
    assert cache.num_locks() == 0


def test_release_takes_a_done_promotion_first() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(9))
    run_request(cache, tokens).release()
    cache.evict(Tier.DEVICE, 4)
    settle(cache, executor)
    handle = CacheHandle(cache, NAMESPACE)
    assert handle.promote(tokens)
    settle(cache, executor)
    handle.release()  # never taken: its lock and pages still go back
    ok(cache)
    assert cache.num_locks() == 0


def test_reserve_is_all_or_nothing() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=4)
    handle = CacheHandle(cache, NAMESPACE)
    assert handle.reserve(12) and len(handle.page_table) == 3
    assert handle.reserve(9)  # covered already
    assert not handle.reserve(20)  # two more pages, one free
    assert len(handle.page_table) == 3
    ok(cache)
    handle.release()
    assert cache.device_pool.num_free == 4


def test_prefetch_reads_disk_pages_towards_host_once_per_look_up(tmp_path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=16, disk_dir=tmp_path
    )
    tokens = list(range(9))
    run_request(cache, tokens).release()
    for tier in (Tier.DEVICE, Tier.HOST):  # down to disk
        cache.evict(tier, 4)
        settle(cache, executor)
    handle = CacheHandle(cache, NAMESPACE)
    handle.look_up(tokens)
    assert handle.matched_tokens_by_tier[Tier.DISK] == 8
    handle.prefetch()
    handle.prefetch()
    assert len(executor.pending()) == 1
    settle(cache, executor)
    handle.look_up(tokens)
    assert handle.matched_tokens_by_tier[Tier.HOST] == 8
    handle.prefetch()  # nothing left on disk only
    assert not executor.pending()
    ok(cache)

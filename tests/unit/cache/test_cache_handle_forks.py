"""`CacheHandle` for a fork (`n` > 1): sharing the parent's prompt pages only while they are all
on the device, and copying the partial last page into the fork's own; check_integrity after
every call."""

from __future__ import annotations

import torch
from test_cache_handle import NAMESPACE, run_request

from tests.support.tiny_cache import device_page, make_cache, tiny_layout
from tests.unit.cache.cache_steps import ok, settle
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.tier import Tier

LAYOUT = tiny_layout(page_size=4)


def test_a_fork_shares_the_resident_prompt_pages_and_copies_the_partial_one() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    tokens = list(range(10))  # two full pages and a partial one
    parent = run_request(cache, tokens)
    cache.device_pool.kv[:, :, parent.page_table[2]] = 7.0  # the partial page's KV
    fork = CacheHandle(cache, NAMESPACE)
    assert fork.share_resident(tokens) == 8
    assert fork.page_table == parent.page_table[:2] and fork.num_tree_pages == 2
    assert cache.num_locks() == 2  # the fork holds the shared path as a cache hit does
    assert fork.reserve(len(tokens)) and fork.page_table[2] != parent.page_table[2]
    fork.copy_pages_from(parent, 2, 3)
    assert torch.equal(
        device_page(cache, fork.page_table[2]), device_page(cache, parent.page_table[2])
    )
    ok(cache)
    fork.release()
    parent.release()
    ok(cache)
    assert cache.num_locks() == 0 and cache.device_pool.num_free == 8 - 2


def test_a_fork_shares_nothing_while_a_prompt_page_is_off_the_device() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(9))
    run_request(cache, tokens).release()
    cache.evict(Tier.DEVICE, 4)
    settle(cache, executor)
    fork = CacheHandle(cache, NAMESPACE)
    fork.look_up(tokens)
    assert fork.matched_tokens_by_tier[Tier.HOST] == 8
    assert fork.share_resident(tokens) is None
    assert fork.page_table == [] and not fork.promotion_pending and cache.num_locks() == 0
    ok(cache)


def test_a_fork_of_an_uncached_prompt_shares_no_page() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=4)
    fork = CacheHandle(cache, NAMESPACE)
    assert fork.share_resident(list(range(9))) == 0
    assert fork.page_table == []
    fork.release()
    ok(cache)

from pathlib import Path

import torch

from tests.support.tiny_cache import (
    device_page,
    expected_pages,
    make_cache,
    tiny_layout,
)
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.index.page_key import token_bytes
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.residency.eviction import LruEvictionPolicy, TierHeap
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier

LAYOUT = tiny_layout(page_size=4)


def test_heap_pops_least_recent_first_and_skips_stale_entries() -> None:
    tree = RadixTree(4, Residence.for_root)
    root = tree.root(b"r" * 16, create=True)
    nodes = []
    for i in range(3):
        node = tree.add_child(root, token_bytes([i] * 4))
        node.residence.set_copy(Tier.DEVICE, [i])
        node.last_access = 10 - i  # the last one is the least recent
        nodes.append(node)
    heap = TierHeap(Tier.DEVICE)
    policy = LruEvictionPolicy()
    for node in nodes:
        heap.push(node, policy.priority(node, Tier.DEVICE))
    nodes[2].last_access = 20
    heap.push(nodes[2], policy.priority(nodes[2], Tier.DEVICE))  # touched: old entry is stale
    assert len(heap) == 4
    assert heap.pop(policy.evictable) is nodes[1]
    nodes[0].lock_count = 1  # locked nodes are skipped
    assert heap.pop(policy.evictable) is nodes[2]
    assert heap.pop(policy.evictable) is None


def test_heap_compacts_stale_entries() -> None:
    tree = RadixTree(4, Residence.for_root)
    node = tree.add_child(tree.root(b"r" * 16, create=True), token_bytes([1] * 4))
    node.residence.set_copy(Tier.HOST, [0])
    heap = TierHeap(Tier.HOST)
    for access in range(5000):
        node.last_access = access
        heap.push(node, LruEvictionPolicy.priority(node, Tier.HOST))
    assert len(heap) <= 2048  # re-pushing one node never grows the heap without bound
    assert heap.pop(LruEvictionPolicy.evictable) is node


def test_eviction_takes_the_tail_of_a_long_leaf() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=4)
    tokens = list(range(17))
    compute(cache, tokens)
    assert cache.allocate(1) is None
    settle(cache, executor)
    match = cache.match(tokens)
    assert (match.device.num_pages, match.host.num_pages) == (3, 1)  # only the tail moved
    assert cache.counters.evicted_pages[Tier.DEVICE, "demoted"] == 1


def test_full_host_drops_clean_lower_copies_first(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=16, disk_dir=tmp_path
    )
    old, new = list(range(9)), list(range(100, 109))
    compute(cache, old)
    compute(cache, new)
    cache.evict(Tier.DEVICE, 4)
    settle(cache, executor)  # both on host now
    match = cache.match(old)
    ticket = cache.promote(match)  # old goes back to device, keeping its host copy
    assert ticket is not None
    settle(cache, executor)
    assert set(cache.match(old).device.nodes[0].residence.copies) == {Tier.DEVICE, Tier.HOST}
    cache.match(old)  # old is now the most recent: LRU alone would evict new's host copy
    assert cache.evict(Tier.HOST, 2)
    kept = cache.match(old).device.nodes[0].residence.copies
    assert Tier.HOST not in kept  # the redundant one went
    assert cache.match(new).host.num_pages == 2 and not executor.pending()
    ok(cache)


def test_prefetch_moves_a_bounded_disk_prefix_to_host(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=16, disk_dir=tmp_path
    )
    tokens = list(range(17))
    compute(cache, tokens)
    cache.evict(Tier.DEVICE, 4)
    settle(cache, executor)
    cache.evict(Tier.HOST, 4)
    settle(cache, executor)
    match = cache.match(tokens)
    assert match.disk.num_pages == 4
    tickets = cache.prefetch(match, max_pages=2)
    assert [t.num_pages for t in tickets] == [2] and tickets[0].dst_tier is Tier.HOST
    ok(cache)
    settle(cache, executor)
    match = cache.match(tokens)
    assert (match.host.num_pages, match.disk.num_pages) == (2, 2)
    for page, want in zip(
        match.host.pages, expected_pages(tokens, "default", LAYOUT), strict=False
    ):
        assert torch.equal(cache.host_pool.kv[page], want)
    assert cache.counters.transfer_bytes[Tier.DISK, Tier.HOST] == 2 * LAYOUT.page_bytes


def disk_only(tmp_path: Path, tokens: list[int]):
    """A cache whose only copy of `tokens`' 4 full pages is on disk."""
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=16, disk_dir=tmp_path
    )
    compute(cache, tokens)
    for tier in (Tier.DEVICE, Tier.HOST):
        cache.evict(tier, 4)
        settle(cache, executor)
    assert cache.match(tokens).disk.num_pages == 4
    return cache, executor


def reads(cache, src: Tier, dst: Tier) -> int:
    return cache.counters.transfer_bytes[src, dst] // LAYOUT.page_bytes


def test_a_promotion_waits_for_its_prefetch_instead_of_reading_the_disk_again(
    tmp_path: Path,
) -> None:
    tokens = list(range(17))
    cache, executor = disk_only(tmp_path, tokens)
    (prefetch,) = cache.prefetch(cache.match(tokens), max_pages=2)  # still reading
    ticket = cache.promote(cache.match(tokens))  # admitted meanwhile
    assert ticket is not None
    ok(cache)  # the pages below the prefetched ones wait too: parents reach the device first
    assert executor.pending() == [prefetch]
    executor.complete(prefetch)
    cache.poll()  # the second stage: the prefetched pages from host, the rest from disk
    second = [(t.src_tier, t.dst_tier, t.num_pages) for t in executor.pending()]
    assert sorted(second) == [(Tier.HOST, Tier.DEVICE, 2), (Tier.DISK, Tier.DEVICE, 2)]
    ok(cache)
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == 4
    assert (reads(cache, Tier.DISK, Tier.HOST), reads(cache, Tier.DISK, Tier.DEVICE)) == (2, 2)
    assert reads(cache, Tier.HOST, Tier.DEVICE) == 2  # the second stage
    assert ticket.tokens_by_tier[Tier.DISK] == 16  # credited to where the pages were
    for page, want in zip(
        ticket.device_pages, expected_pages(tokens, "default", LAYOUT), strict=True
    ):
        assert torch.equal(device_page(cache, page), want)


def test_a_promotion_whose_prefetch_failed_reads_the_store_itself(
    tmp_path: Path,
) -> None:
    tokens = list(range(17))
    cache, executor = disk_only(tmp_path, tokens)
    (prefetch,) = cache.prefetch(cache.match(tokens), max_pages=4)
    ticket = cache.promote(cache.match(tokens))
    assert ticket is not None and not ticket.done
    assert [t for t in executor.pending() if t is not prefetch] == []  # nothing read twice
    executor.fail(prefetch, OSError("EIO"))
    cache.poll()  # the failed read is applied: the disk copies stay, the second stage reads them
    second = [(t.src_tier, t.dst_tier, t.num_pages) for t in executor.pending()]
    assert second == [(Tier.DISK, Tier.DEVICE, 4)]
    settle(cache, executor)
    assert ticket.done and ticket.num_ready_pages == 4
    want = expected_pages(tokens, "default", LAYOUT)
    for page, expected in zip(ticket.device_pages, want, strict=True):
        assert torch.equal(device_page(cache, page), expected)


def test_flush_drops_everything_unlocked_and_matches_nothing_it_kept(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=4, host_pages=4, disk_pages=16, disk_dir=tmp_path
    )
    kept, gone = list(range(9)), list(range(100, 109))
    compute(cache, kept)
    compute(cache, gone)
    cache.evict(Tier.DEVICE, 2)
    settle(cache, executor)
    cache.evict(Tier.HOST, 2)
    settle(cache, executor)
    locked = cache.match(kept).last_node
    assert locked is not None
    cache.lock(locked)
    assert cache.flush() > 0
    ok(cache)
    assert cache.match(gone).matched_len == 0
    assert cache.match(kept).matched_len == 0  # held by its lock, never matched again
    assert locked.attached and locked.residence.copies
    cache.unlock(locked)
    cache.flush()
    assert cache.match(kept).matched_len == 0
    for tier in Tier:
        assert cache.tier_used_bytes(tier) == 0
    ok(cache)


def test_a_parent_whose_child_left_first_can_still_be_demoted() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, host_pages=8)
    tokens = list(range(17))
    compute(cache, tokens)
    cache.evict(Tier.DEVICE, 2)  # the tail (a child now) goes to host first
    settle(cache, executor)
    match = cache.match(tokens)
    assert (match.device.num_pages, match.host.num_pages) == (2, 2)
    cache.evict(Tier.DEVICE, 4)  # the parent is device-only with a child on host
    settle(cache, executor)
    assert cache.allocate(4) is not None
    assert cache.match(tokens).host.num_pages == 4
    ok(cache)

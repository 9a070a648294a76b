"""Copies without some pages' sliding part (`sliding_gaps`): a copy made from one keeps its
gaps, splits carry them, a match is cut back to where a continuation reads no gap, and an insert
never hands a request the tree's gapped pages in place of its own."""

from __future__ import annotations

import torch

from tests.support.sliding_drop import drop_sliding_parts
from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.index.page_key import namespace_root_key, token_bytes
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.model_config import ModelConfig

LAYOUT = tiny_layout(page_size=4)
WINDOW = 9  # a continuation from token b reads tokens b - 8 .. b - 1: two or three pages


def model(window: int | None) -> ModelConfig | None:
    """The tiny layout's model: layer 0 sliding (`window`), layer 1 full."""
    if window is None:
        return None
    return ModelConfig(
        vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2,
        num_kv_heads=1, head_dim=4, layer_windows=(window, None),
    )  # fmt: skip


def history_on_host(window: int | None = WINDOW) -> tuple[TieredCache, list[int]]:
    """A cache whose only copy of a 10-page history is on host."""
    cache, executor = make_cache(LAYOUT, device_pages=16, host_pages=32, model=model(window))
    history = list(range(100, 140))
    compute(cache, history)
    cache.evict(Tier.DEVICE, 16)  # demoted to host once the copies are applied
    settle(cache, executor)
    assert cache.match([*history, 1]).host.num_pages == 10
    return cache, history


def test_a_copy_without_sliding_parts_serves_matches_up_to_its_windows() -> None:
    cache, history = history_on_host()
    node = cache.match([*history, 1]).last_node
    assert drop_sliding_parts(cache.residency, node, Tier.HOST) == frozenset(range(8))
    ok(cache)
    assert cache.match([*history, 1]).matched_len == 40  # its end kept its window
    # diverging at token 30: page 7 lacks the sliding part a continuation from 28 reads, and
    # so does every page before it: nothing is reusable
    assert cache.match([*history[:30], 7, 7, 7]).matched_len == 0
    ok(cache)
    assert cache.match([*history[:28], 1]).matched_len == 0  # from 28: pages 5 and 6
    # the divergent match split the node after page 7: each part keeps its pages' gaps
    tail = cache.match([*history, 1]).last_node
    assert tail.residence.sliding_gaps == {Tier.HOST: frozenset({0})}  # page 7 of the history
    assert tail.parent.residence.sliding_gaps == {Tier.HOST: frozenset(range(7))}
    assert cache.match([*history, 1]).matched_len == 40


def test_promotion_carries_the_gaps_to_the_device_copy() -> None:
    cache, history = history_on_host()
    drop_sliding_parts(cache.residency, cache.match([*history, 1]).last_node, Tier.HOST)
    match = cache.match([*history, 1])
    ticket = cache.promote(match)
    settle(cache, cache.transfer_queue.memory_executor)
    assert ticket.done and ticket.num_ready_pages == 10
    node = cache.match([*history, 1]).last_node
    assert cache.match([*history, 1]).device.num_pages == 10
    assert node.residence.device_gaps() == frozenset(range(8))
    ok(cache)


def test_an_insert_fills_a_gapped_device_copy_from_the_pages_it_computed() -> None:
    """A request that computed pages whose device copy lacks sliding parts gives the tree's
    copy its sliding layers (under new stamps, for the workspaces) and takes the tree's pages,
    as for any duplicate; the full layers the tree's readers use stay as they are."""
    cache, executor = make_cache(LAYOUT, device_pages=32, host_pages=32, model=model(WINDOW))
    history = list(range(100, 140))
    compute(cache, history)
    cache.evict(Tier.DEVICE, 32)  # to host, then back with the host copy's gaps
    settle(cache, executor)
    drop_sliding_parts(cache.residency, cache.match([*history, 1]).last_node, Tier.HOST)
    ticket = cache.promote(cache.match([*history, 1]))
    settle(cache, executor)
    path = cache.match([*history, 1]).last_node.path()  # split where the match was cut
    tree_pages = [page for node in path for page in node.residence.copies[Tier.DEVICE]]
    gaps, first = set(), 0
    for node in path:
        gaps.update(first + index for index in node.residence.device_gaps())
        first += node.num_pages
    assert gaps and ticket.done
    device = cache.pools.device
    stamps = device.stamps[tree_pages].copy()
    full_before = device.kv[1][:, tree_pages].clone()
    pages = cache.allocate(10)  # a request that computed the whole history itself
    device.kv[:, :, pages] = torch.randn_like(device.kv[:, :, pages])
    result = cache.insert(history, "default", pages)
    assert result.num_pages == 10 and list(result.device_pages) == tree_pages
    assert sorted(result.duplicate_pages) == sorted(pages)
    assert all(node.residence.device_gaps() == frozenset() for node in path)
    filled = [tree_pages[i] for i in sorted(gaps)]
    mine = [pages[i] for i in sorted(gaps)]
    assert torch.equal(device.kv[0][:, filled], device.kv[0][:, mine])  # the sliding layer
    assert torch.equal(device.kv[1][:, tree_pages], full_before)  # the full one: untouched
    restamped = [i for i, page in enumerate(tree_pages) if device.stamps[page] != stamps[i]]
    assert restamped == sorted(gaps)
    cache.free(list(result.duplicate_pages))
    ok(cache)


def test_an_insert_keeps_its_own_pages_where_a_split_device_has_no_room_to_fill() -> None:
    cache, _ = make_cache(
        LAYOUT, device_pages=16, host_pages=0, model=model(WINDOW), split_device=True
    )
    history = list(range(100, 140))
    compute(cache, history)
    node = cache.match([*history, 1]).last_node
    drop_sliding_parts(cache.residency, node, Tier.DEVICE)  # marked only: no room is freed
    gaps = node.residence.device_gaps()
    device = cache.pools.device
    pages = device.alloc(device.num_free)  # a request holding every free page
    assert device.sliding_room() < len(gaps)
    result = cache.insert(history, "default", pages[:10])
    assert result.num_pages == 0 and result.device_pages == ()
    kept_gaps, first = set(), 0
    for path_node in cache.match([*history, 1]).last_node.path():  # split where the walk ended
        kept_gaps.update(first + index for index in path_node.residence.device_gaps())
        first += path_node.num_pages
    assert kept_gaps == gaps  # nothing filled
    device.free(pages)
    ok(cache)


def test_without_a_window_nothing_is_cut() -> None:
    cache, history = history_on_host(window=None)
    assert cache.match([*history[:30], 7, 7, 7]).matched_len == 28
    ok(cache)


def test_splits_and_merges_carry_each_copys_gaps() -> None:
    tree = RadixTree(4, Residence.for_root)
    root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
    node = tree.add_child(root, token_bytes(range(24)))
    node.residence.set_copy(Tier.DEVICE, list(range(6)))
    node.residence.set_copy(Tier.HOST, list(range(10, 16)), frozenset({0, 1, 4}))
    head = tree.split(node, 3)
    assert head.residence.sliding_gaps == {Tier.HOST: frozenset({0, 1})}
    assert node.residence.sliding_gaps == {Tier.HOST: frozenset({1})}
    assert node.residence.serving_gaps() == frozenset()  # served from the device copy
    assert tree.can_merge(head)
    merged = tree.merge(head)
    assert merged.residence.sliding_gaps == {Tier.HOST: frozenset({0, 1, 4})}
    merged.residence.pop_copy(Tier.DEVICE)
    assert merged.residence.serving_gaps() == frozenset({0, 1, 4})
    merged.residence.pop_copy(Tier.HOST)
    assert merged.residence.sliding_gaps == {}


def test_a_copy_written_down_keeps_its_sources_gaps_across_a_restart(tmp_path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=16, host_pages=16, disk_pages=32, disk_dir=tmp_path,
        model=model(WINDOW),
    )  # fmt: skip
    history = list(range(100, 140))
    compute(cache, history)
    cache.evict(Tier.DEVICE, 16)
    settle(cache, executor)
    node = cache.match([*history, 1]).last_node
    drop_sliding_parts(cache.residency, node, Tier.HOST)
    cache.evict(Tier.HOST, 16)  # written to disk from the host copy, then freed there
    (part,) = node.residence.inflight.values()
    assert part.dst_tier is Tier.DISK and part.sliding_gaps == frozenset(range(8))
    settle(cache, executor)
    assert cache.match([*history, 1]).disk.num_pages == 10
    assert node.residence.sliding_gaps == {Tier.DISK: frozenset(range(8))}
    assert cache.match([*history[:30], 7, 7, 7]).matched_len == 0
    assert cache.match([*history, 1]).matched_len == 40
    ok(cache)
    cache.close()
    # the records say which pages lack the part: a restart rebuilds the same gaps and cut
    again, _ = make_cache(
        LAYOUT, device_pages=16, host_pages=16, disk_pages=32, disk_dir=tmp_path,
        model=model(WINDOW),
    )  # fmt: skip
    rebuilt = again.match([*history, 1])
    assert rebuilt.disk.num_pages == 10 and rebuilt.matched_len == 40
    (rebuilt_node,) = rebuilt.disk.nodes
    assert rebuilt_node.residence.sliding_gaps == {Tier.DISK: frozenset(range(8))}
    assert again.match([*history[:30], 7, 7, 7]).matched_len == 0
    ok(again)
    again.close()


def test_the_host_pool_splits_only_when_asked_with_or_without_a_store_below(tmp_path) -> None:
    def host(**kw) -> HostPool:
        cache, _ = make_cache(LAYOUT, device_pages=4, host_pages=8, **kw)
        return cache.pools.host

    assert type(host(model=model(WINDOW))) is HostPool
    split = host(model=model(WINDOW), split_host=True)
    assert isinstance(split, SplitHostPool) and split.num_pages > 8
    # the disk's records say which pages lack the part: a store below changes nothing
    below = host(model=model(WINDOW), split_host=True, disk_pages=8, disk_dir=tmp_path)
    assert isinstance(below, SplitHostPool) and below.num_pages == split.num_pages
    assert type(host(split_host=True)) is HostPool  # no sliding layers: whole pages

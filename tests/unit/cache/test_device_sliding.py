"""A split device pool's sliding parts freed as no window reads them (`DeviceSliding`): a running
sequence's passed pages where it is the path's only lock, the rule's drops when the last lock
goes, and a promotion from a copy with gaps that allocates no part for them."""

from __future__ import annotations

from tests.support.tiny_cache import make_cache
from tests.unit.cache.cache_steps import compute, ok, settle
from tests.unit.cache.test_sliding_gaps import LAYOUT, WINDOW, model
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import WritePolicy

HISTORY = list(range(100, 140))  # 10 pages of 4 tokens


def split_cache(host_pages: int = 0) -> tuple[TieredCache, object]:
    cache, executor = make_cache(
        LAYOUT, device_pages=16, host_pages=host_pages, model=model(WINDOW), split_device=True
    )
    assert isinstance(cache.pools.device, SplitDevicePool)
    return cache, executor


def node_ending_at(cache: TieredCache, tokens: list[int]):
    """The node the path of `tokens` ends at (split there: a middle of the cached path)."""
    pages = cache.allocate(len(tokens) // cache.page_size)
    result = cache.insert(tokens, "default", pages)
    cache.free([p for p in pages if p not in result.device_pages])
    return result.node


def test_a_sequence_frees_the_parts_its_window_passed_not_those_it_still_reads() -> None:
    cache, _ = split_cache()
    compute(cache, HISTORY)
    middle = node_ending_at(cache, HISTORY[:24])  # one child below: no reuse point at 24
    assert middle.num_pages == 6 and len(middle.children) == 1
    cache.lock(middle)  # a sequence that has computed 24 tokens of this path, alone on it
    cache.window_passed(middle, 24)
    # its next queries read keys 16 .. 23 (pages 4 and 5): those keep their sliding part
    assert middle.residence.device_gaps() == {0, 1, 2, 3}
    device = cache.pools.device
    pages = middle.residence.copies[Tier.DEVICE]
    assert [page in device.sliding_of for page in pages] == [False] * 4 + [True] * 2
    ok(cache)
    cache.unlock(middle)  # now nothing reads them: the rule keeps only the path end's window
    assert middle.residence.device_gaps() == set(range(6))
    leaf = next(iter(middle.children.values()))
    assert leaf.residence.device_gaps() == set()  # the end's window and margin: all 4 pages
    ok(cache)


def test_a_node_another_lock_holds_keeps_its_parts_until_the_last_lock_goes() -> None:
    cache, _ = split_cache()
    compute(cache, HISTORY)
    middle = node_ending_at(cache, HISTORY[:24])
    cache.lock(middle)
    cache.lock(middle)  # a second reader, whose position is not known
    cache.window_passed(middle, 24)
    assert middle.residence.device_gaps() == frozenset()
    cache.unlock(middle)
    assert middle.residence.device_gaps() == frozenset()  # still locked
    cache.unlock(middle)
    assert middle.residence.device_gaps() == set(range(6))
    ok(cache)


def test_the_freed_layer_pages_make_room_for_whole_pages() -> None:
    cache, _ = split_cache()
    device = cache.pools.device
    before = device.num_free
    compute(cache, HISTORY)
    middle = node_ending_at(cache, HISTORY[:24])
    cache.lock(middle)
    cache.unlock(middle)  # pages 0 .. 5 drop their sliding layer: 6 layer pages, 3 pages
    assert device.num_free == before - 10 + 3
    assert cache.device_pages_held(middle.residence.copies[Tier.DEVICE]) == 3
    ok(cache)


def test_a_promotion_from_a_copy_with_gaps_gives_those_pages_no_sliding_part() -> None:
    cache, executor = split_cache(host_pages=32)
    compute(cache, HISTORY)
    middle = node_ending_at(cache, HISTORY[:24])
    cache.lock(middle)
    cache.unlock(middle)
    gaps = middle.residence.device_gaps()
    assert gaps
    for _ in range(3):  # the leaf leaves first, then the node it hangs from
        cache.evict(Tier.DEVICE, cache.pools.device.max_pages)
        settle(cache, executor)
    assert Tier.DEVICE not in middle.residence.copies
    assert middle.residence.sliding_gaps[Tier.HOST] == gaps  # the copy down kept them
    held_before = cache.pools.device.num_sliding_held
    match = cache.match([*HISTORY, 1])
    assert match.host.num_pages == 10
    assert cache.promote(match) is not None
    settle(cache, executor)
    assert middle.residence.device_gaps() == gaps
    assert cache.pools.device.num_sliding_held == held_before + 10 - len(gaps)
    ok(cache)


def test_a_copy_being_read_keeps_its_parts_until_the_transfer_is_applied() -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=16, host_pages=32, model=model(WINDOW), split_device=True,
        write_policy=WritePolicy.WRITE_THROUGH,
    )  # fmt: skip
    compute(cache, HISTORY)  # its write-through copy to host starts, reading the device copy
    middle = node_ending_at(cache, HISTORY[:24])
    assert executor.pending()
    cache.lock(middle)
    cache.unlock(middle)  # the rule drops pages 0 .. 5, but a transfer is reading them
    assert middle.residence.device_gaps() == frozenset()
    settle(cache, executor)  # applied: the rule applies now
    assert middle.residence.device_gaps() == set(range(6))
    ok(cache)


def test_a_device_short_of_room_frees_unread_parts_before_evicting() -> None:
    cache, _ = split_cache()
    compute(cache, HISTORY)  # inserted unlocked and never unlocked: every part still held
    node = cache.match([*HISTORY, 1]).last_node
    device = cache.pools.device
    assert device.num_free == 6  # 32 layer pages, 20 held
    pages = cache.allocate(8)  # the walk frees the 6 parts no reuse point reads: no eviction
    assert pages is not None and len(pages) == 8
    assert node.residence.device_gaps() == set(range(6))
    assert len(node.residence.copies[Tier.DEVICE]) == 10
    cache.free(pages)
    ok(cache)

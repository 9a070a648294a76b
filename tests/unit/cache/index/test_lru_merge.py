"""A merge after an eviction keeps LRU order exact: pages never look younger than they are."""

from tests.support.tiny_cache import make_cache, tiny_layout
from tieredkv.cache.tiered_cache import TieredCache

LAYOUT = tiny_layout(4)
S, B, C, D = ([base + i for i in range(8)] for base in (100, 200, 300, 400))  # 2 pages each


def _put(cache: TieredCache, tokens: list[int]) -> None:
    pages = cache.allocate(len(tokens) // 4)
    assert pages is not None
    result = cache.insert(tokens, "ns", pages)
    cache.free(list(result.duplicate_pages) + pages[result.num_pages :])
    assert cache.check_integrity().ok


def _cached_pages(cache: TieredCache, tokens: list[int]) -> int:
    return cache.match([*tokens, 0], "ns").num_pages


def _full_tree(touch_shared_last: bool) -> TieredCache:
    """S+B, S+C and D fill the device; B is the least recently used leaf, then C, then D."""
    cache, _ = make_cache(LAYOUT, device_pages=8)
    _put(cache, S + B)
    _put(cache, S + C)
    _put(cache, D)
    cache.match([*S, *B, 0], "ns")
    cache.match([*S, *C, 0], "ns")
    cache.match([*D, 0], "ns")
    if touch_shared_last:
        cache.match([*S, 9, 9, 9, 9, 9], "ns")  # a prompt that shares only S: S is newest
    return cache


def test_a_parent_used_since_its_child_does_not_lend_it_its_time() -> None:
    cache = _full_tree(touch_shared_last=True)
    assert cache.allocate(2) is not None  # evicts B, the least recently used leaf
    # C was used before D: its page goes first. Merged into S with S's newer time, C would
    # have looked younger than D, and D would have lost a page instead.
    assert cache.allocate(1) is not None
    assert _cached_pages(cache, D) == 2
    assert _cached_pages(cache, S + C) == 3
    assert _cached_pages(cache, S + B) == 2
    assert cache.check_integrity().ok


def test_a_child_used_with_its_parent_merges_and_keeps_its_place() -> None:
    cache = _full_tree(touch_shared_last=False)
    assert cache.tree.num_nodes == 4
    assert cache.allocate(2) is not None  # evicts B; S and C merge into one run
    assert cache.tree.num_nodes == 2
    assert cache.allocate(1) is not None  # the run's tail (C, older than D) goes first
    assert _cached_pages(cache, D) == 2 and _cached_pages(cache, S + C) == 3
    assert cache.check_integrity().ok

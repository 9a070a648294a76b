"""Namespaces: a flush scoped to some namespaces leaves the others alone, and a namespace left
with no pages costs nothing (its root is freed)."""

from __future__ import annotations

from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute
from tieredkv.cache.tier import Tier

LAYOUT = tiny_layout(page_size=4)


def test_a_scoped_flush_drops_only_the_namespaces_it_accepts() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=32)
    tokens = list(range(9))
    for namespace in ("tenant-a", "tenant-a/x", "tenant-b"):
        compute(cache, tokens, namespace)
    flushed = cache.flush(within=lambda name: name.startswith("tenant-a"))
    assert flushed == 4  # two pages in each of tenant-a's namespaces
    assert cache.match(tokens, "tenant-b").device.num_pages == 2
    assert cache.match(tokens, "tenant-a").num_pages == 0
    assert cache.match(tokens, "tenant-a/x").num_pages == 0
    assert cache.check_integrity().ok


def test_a_scoped_flush_keeps_locked_pages() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=32)
    tokens = list(range(17))
    compute(cache, tokens, "a")
    match = cache.match(tokens[:9], "a")  # the first two pages: a split, then a lock
    assert match.last_node is not None
    cache.lock(match.last_node)
    assert cache.flush(within=lambda name: name == "a") == 2  # the unlocked tail only
    assert cache.match(tokens, "a").device.num_pages == 2
    cache.unlock(match.last_node)
    assert cache.check_integrity().ok


def test_a_namespace_left_empty_frees_its_root() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    for salt in range(50):  # each distinct salt stores a page, then is evicted by the next
        compute(cache, [salt] * 5, f"salt-{salt}")
    assert len(cache.tree.roots) <= 8  # one per namespace that still holds a page
    assert set(cache.tree.names) == set(cache.tree.roots)
    cache.flush()
    assert cache.tree.roots == {} and cache.tree.names == {}
    assert cache.tier_used_bytes(Tier.DEVICE) == 0
    assert cache.check_integrity().ok

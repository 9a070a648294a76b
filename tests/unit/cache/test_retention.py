"""Retained prefixes ("24h") in the cache: their lowest local copy stays whatever else fills
the tiers, the budget releases the least recently used first (within a namespace's share when
that namespace is over it), and the guarantee ends 24 hours after the last use."""

from pathlib import Path

from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tests.unit.cache.test_pins import flood, tiers_of
from tieredkv.cache.retention import RETENTION_S
from tieredkv.cache.tier import Tier

LAYOUT = tiny_layout(page_size=4)
RETAINED = list(range(1000, 1009))  # 2 full pages and one token
OTHER = list(range(3000, 3009))


def test_a_retained_prefix_outlives_a_flood_larger_than_every_tier(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=6, host_pages=8, disk_pages=16, disk_dir=tmp_path
    )
    compute(cache, RETAINED)
    compute(cache, OTHER)
    assert cache.retention.retain(RETAINED, "default", now=0.0)
    settle(cache, executor)
    flood(cache, executor, 12)  # 36 pages: more than the 30 of all three tiers
    ok(cache)
    assert tiers_of(cache, RETAINED) == {Tier.DISK: 8}  # both pages, from the lowest tier
    assert tiers_of(cache, OTHER) == {}  # not retained: gone from every tier
    figures = cache.retention.figures(now=1.0)
    assert figures.pages_by_tier[Tier.DISK] == 2 and figures.evicted_total == 0


def test_without_a_disk_tier_the_host_copy_is_kept() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=6, host_pages=8)
    compute(cache, RETAINED)
    assert cache.retention.retain(RETAINED, "default", now=0.0)
    settle(cache, executor)
    flood(cache, executor, 8)
    assert (
        tiers_of(cache, RETAINED).get(Tier.DEVICE, 0) + tiers_of(cache, RETAINED).get(Tier.HOST, 0)
        == 8
    )
    no_lower, _ = make_cache(LAYOUT, device_pages=8)
    compute(no_lower, RETAINED)
    assert not no_lower.retention.retain(RETAINED, "default", now=0.0)  # device alone: never


def test_the_budget_releases_the_least_recently_used_prefix_first(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=8, host_pages=8, disk_pages=32, disk_dir=tmp_path, retention_pages=4
    )
    first, second, third = RETAINED, OTHER, list(range(5000, 5009))
    for prompt in (first, second, third):
        compute(cache, prompt)
    assert not cache.retention.retain([1, 2, 3], "default", now=0.0)  # no full page
    assert cache.retention.retain(first, "default", now=0.0)
    assert cache.retention.retain(second, "default", now=1.0)
    assert cache.retention.retain(first, "default", now=2.0)  # used again: most recent
    assert cache.retention.retain(third, "default", now=3.0)  # 6 pages > 4: one must go
    settle(cache, executor)
    assert cache.retention.evicted_total == 1
    assert ("default", tuple(second[:8])) not in cache.retention
    assert ("default", tuple(first[:8])) in cache.retention
    flood(cache, executor, 20)  # 60 pages: more than every tier
    assert tiers_of(cache, first) == {Tier.DISK: 8} == tiers_of(cache, third)
    assert tiers_of(cache, second) == {}  # lost its guarantee, then left as LRU pages do


def test_a_namespace_over_its_share_gives_up_its_own_prefix_first() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=16, host_pages=16, retention_pages=4)
    a1, a2, b1, b2 = (list(range(base, base + 8)) for base in (100, 200, 300, 400))
    for prompt, namespace in ((a1, "a"), (a2, "a"), (b1, "b"), (b2, "b")):
        compute(cache, prompt, namespace)
    assert cache.retention.retain(a1, "a", now=0.0)
    assert cache.retention.retain(a2, "a", now=1.0)  # "a" alone: the whole budget
    assert cache.retention.retain(b1, "b", now=2.0)  # over the budget: a1, the LRU, goes
    assert cache.retention.pages_in("a") == 2 and cache.retention.pages_in("b") == 2
    assert cache.retention.retain(b2, "b", now=3.0)  # "b" over its half: its own b1 goes
    assert ("a", tuple(a2)) in cache.retention and ("b", tuple(b1)) not in cache.retention
    assert cache.retention.evicted_total == 2
    settle(cache, executor)


def test_the_guarantee_ends_24_hours_after_the_last_use(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=6, host_pages=8, disk_pages=16, disk_dir=tmp_path
    )
    compute(cache, RETAINED)
    assert cache.retention.retain(RETAINED, "default", now=0.0)
    assert cache.retention.retain(RETAINED, "default", now=100.0)  # used again
    cache.retention.expire(now=RETENTION_S + 99.0)
    assert len(cache.retention) == 1
    cache.retention.expire(now=RETENTION_S + 100.0)
    assert len(cache.retention) == 0 and cache.retention.expired_total == 1
    settle(cache, executor)
    flood(cache, executor, 12)
    assert tiers_of(cache, RETAINED) == {}

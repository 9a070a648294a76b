"""TierPools: every tier's pool reached through one mapping, a disabled tier left out of it, and
one degraded flag per tier (the pool's) that turns demotion to that tier into drops. Real pools
and a real disk store in tmp_path."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from tests.support.fault_io import FaultInjectingIO
from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.tier import Tier

LAYOUT = tiny_layout(page_size=4)
FIRST, SECOND = list(range(17)), list(range(100, 117))  # 4 full pages each


def test_each_tier_pool_is_reached_through_one_mapping(tmp_path: Path) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=4, host_pages=3, disk_pages=8, disk_dir=tmp_path)
    pools = cache.pools
    assert list(pools) == [Tier.DEVICE, Tier.HOST, Tier.DISK] and len(pools) == 3
    assert pools[Tier.DEVICE] is cache.device_pool and pools[Tier.HOST] is cache.host_pool
    assert isinstance(pools[Tier.DISK], DiskStore) and pools[Tier.DISK] is pools.disk
    assert [pools.lower(tier) for tier in Tier] == [Tier.HOST, Tier.DISK, None, None]
    for tier, pool in pools.items():
        assert pool.tier is tier and pools.enabled(tier) and pools.healthy(tier)
        assert pools.num_pages(tier) == pool.num_pages >= 3
        assert cache.tier_capacity_bytes(tier) == pool.num_pages * LAYOUT.page_bytes
        pages = pools.alloc(tier, 2)
        assert pages == [0, 1] and not pool.is_free(0) and not pool.is_free(1)
        assert pools.num_free(tier) == pool.num_free == pool.num_pages - 2
        assert cache.tier_used_bytes(tier) == 2 * LAYOUT.page_bytes
        pools.free(tier, pages)
        assert pools.num_free(tier) == pool.num_pages and cache.tier_used_bytes(tier) == 0
    ok(cache)
    cache.close()


def test_a_disabled_tier_has_no_pool_and_demotion_skips_it(tmp_path: Path) -> None:
    cache, executor = make_cache(LAYOUT, device_pages=4, disk_pages=8, disk_dir=tmp_path)
    pools = cache.pools
    assert list(pools) == [Tier.DEVICE, Tier.DISK] and Tier.HOST not in pools
    assert not pools.enabled(Tier.HOST) and not cache.tier_healthy(Tier.HOST)
    assert pools.num_pages(Tier.HOST) == pools.num_free(Tier.HOST) == 0
    assert cache.tier_capacity_bytes(Tier.HOST) == cache.tier_used_bytes(Tier.HOST) == 0
    assert pools.lower(Tier.DEVICE) is Tier.DISK
    compute(cache, FIRST)
    assert cache.allocate(4) is None  # the device is full: FIRST starts moving to disk
    settle(cache, executor)
    assert cache.match(FIRST).disk.num_pages == 4
    assert cache.counters.evicted_pages[Tier.DEVICE, "demoted"] == 4
    assert cache.tier_used_bytes(Tier.DISK) == 4 * LAYOUT.page_bytes
    cache.close()


@pytest.mark.parametrize("by", ["engine", "store"])
def test_one_degraded_flag_turns_demotion_to_disk_into_drops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, by: str
) -> None:
    """The disk tier degrades when the engine marks it (a failed write ticket) or when the
    store itself sees a failure (here: invalidating freed records): either way it is the one
    flag, the store's, that health and demotion read."""
    io = FaultInjectingIO(direct_io=False)
    cache, executor = make_cache(LAYOUT, 4, 4, 16, tmp_path, disk_io=io)
    pools, disk = cache.pools, cache.pools.disk
    assert disk is not None
    compute(cache, FIRST)
    cache.evict(Tier.DEVICE, 4)
    settle(cache, executor)
    assert cache.match(FIRST).host.num_pages == 4
    with caplog.at_level(logging.WARNING):
        if by == "engine":
            pools.mark_degraded(Tier.DISK, "write failed: test")
        else:
            slots = pools.alloc(Tier.DISK, 1)
            io.fail_write(errno.EROFS)
            pools.free(Tier.DISK, slots)  # counted, logged, freed all the same
            assert cache.disk_page_errors()[DiskErrorReason.IO] == 1
            assert pools.num_free(Tier.DISK) == pools.num_pages(Tier.DISK)
        pools.mark_degraded(Tier.DISK, "again")
    assert disk.degraded and pools[Tier.DISK].degraded
    assert len([r for r in caplog.records if "disk tier degraded" in r.getMessage()]) == 1
    assert cache.tier_enabled(Tier.DISK) and not cache.tier_healthy(Tier.DISK)
    assert pools.healthy(Tier.HOST) and not pools[Tier.HOST].degraded
    assert pools.lower(Tier.DEVICE) is Tier.HOST and pools.lower(Tier.HOST) is None
    compute(cache, SECOND)
    cache.evict(Tier.DEVICE, 4)  # the host is full: FIRST leaves it, dropped instead of demoted
    settle(cache, executor)
    assert cache.counters.evicted_pages[Tier.HOST, "dropped"] == 4
    assert cache.counters.evicted_pages[Tier.HOST, "demoted"] == 0
    assert cache.match(FIRST).matched_len == 0 and cache.match(SECOND).host.num_pages == 4
    assert cache.tier_used_bytes(Tier.DISK) == 0
    cache.close()

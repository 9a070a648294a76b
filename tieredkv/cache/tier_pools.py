"""Every tier's pool behind one mapping, `Tier -> PagePool`, fastest first.

A tier is enabled when its pool has pages (only enabled tiers are in the mapping) and healthy
while enabled and its pool is not degraded. Demotion goes to the next enabled, healthy tier
(`lower`), else the page is dropped. A new tier is one more pool in the mapping.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.free_list import PagePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.remote.remote_tier import REMOTE_ERROR_REASONS
from tieredkv.cache.tier import Tier

if TYPE_CHECKING:
    from tieredkv.cache.disk.split_store import SplitDiskStore
    from tieredkv.cache.disk.store import DiskStore
    from tieredkv.cache.remote.remote_tier import RemoteTier


class TierPools(Mapping[Tier, PagePool]):
    """Allocation, freeing, sizes and health per tier (engine thread only).

    `device`, `host`, `disk` and `remote` stay reachable by type for what needs their memory or
    their store (the transfer jobs, the store's reads, the remote look-up, the stores' error counts,
    state and closing); everything else goes through the mapping. A disabled tier has no pool
    in it: `num_pages`, `num_free` and the byte figures are 0 there.
    """

    def __init__(
        self,
        device: DevicePool,
        host: HostPool,
        disk: DiskStore | SplitDiskStore | None,
        remote: RemoteTier | None = None,
    ) -> None:
        self.device = device
        self.host = host
        self.disk = disk
        self.remote = remote
        self.layout: PageLayout = device.layout
        pools = (device, host, disk, remote)
        self._pools: dict[Tier, PagePool] = {
            pool.tier: pool for pool in pools if pool is not None and pool.num_pages > 0
        }

    def __getitem__(self, tier: Tier) -> PagePool:
        return self._pools[tier]

    def __iter__(self) -> Iterator[Tier]:
        return iter(self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    def enabled(self, tier: Tier) -> bool:
        return tier in self._pools

    def healthy(self, tier: Tier) -> bool:
        """Enabled and taking new copies."""
        return tier in self._pools and not self._pools[tier].degraded

    def mark_degraded(self, tier: Tier, reason: str) -> None:
        """`tier` takes no new copies from now on: demotions to it become drops."""
        self._pools[tier].mark_degraded(reason)

    def lower(self, tier: Tier) -> Tier | None:
        """The next enabled, healthy tier below `tier`, or None (demotion becomes a drop)."""
        return next((below for below in self._pools if below > tier and self.healthy(below)), None)

    def num_pages(self, tier: Tier) -> int:
        return self._pools[tier].num_pages if tier in self._pools else 0

    def num_free(self, tier: Tier) -> int:
        return self._pools[tier].num_free if tier in self._pools else 0

    def max_pages(self, tier: Tier) -> int:
        """The most pages `tier` can hold: a pool kept a layer at a time holds more the fewer
        sliding parts it keeps, up to its pages without any."""
        pool = self._pools.get(tier)
        return 0 if pool is None else getattr(pool, "max_pages", pool.num_pages)

    def alloc(self, tier: Tier, count: int) -> list[int]:
        """`count` pages of `tier`, all or nothing (OutOfPagesError)."""
        return self._pools[tier].alloc(count)

    def free(self, tier: Tier, pages: list[int]) -> None:
        if pages:  # an empty list may name a disabled tier
            self._pools[tier].free(pages)

    def used_bytes(self, tier: Tier) -> int:
        """Allocated pages (copies, requests' pages, and destinations in flight) in bytes."""
        pool = self._pools.get(tier)
        if isinstance(pool, LayerPages):  # a split pool: its layer pages
            return pool.used_bytes
        return (self.num_pages(tier) - self.num_free(tier)) * self.layout.page_bytes

    def capacity_bytes(self, tier: Tier) -> int:
        pool = self._pools.get(tier)
        if isinstance(pool, LayerPages):
            return pool.capacity_bytes
        return self.num_pages(tier) * self.layout.page_bytes

    def parts_held(self, tier: Tier) -> tuple[int, int]:
        """(allocated pages, sliding parts among them): a split device or host pool and a
        remote tier that keeps parts hold a sliding part for some of their pages, every other
        pool one for each."""
        pages = self.num_pages(tier) - self.num_free(tier)
        pool = self._pools.get(tier)
        if isinstance(pool, LayerPages):
            return pages, pool.num_sliding_held
        if tier is Tier.REMOTE and self.remote is not None:
            return pages, self.remote.num_sliding_held
        return pages, pages

    def disk_page_errors(self) -> dict[DiskErrorReason, int]:
        """Disk records or files refused, by reason; every reason present, 0 without a disk."""
        if self.disk is None:
            return dict.fromkeys(DiskErrorReason, 0)
        return self.disk.page_errors()

    def remote_page_errors(self) -> dict[str, int]:
        """Remote values refused and calls failed, by reason; every reason present, 0 without
        the remote tier."""
        if self.remote is None:
            return dict.fromkeys(REMOTE_ERROR_REASONS, 0)
        return self.remote.page_errors()

    def remote_store_state(self) -> dict | None:
        """The remote store's counters, health and last error; None without the tier."""
        return None if self.remote is None else self.remote.state()

    def disk_direct_io(self) -> bool | None:
        """Whether the disk tier uses O_DIRECT; None without a disk tier."""
        return None if self.disk is None else self.disk.direct_io

    def close_stores(self) -> None:
        """Close the disk and remote stores (nothing may read or write them afterwards)."""
        if self.disk is not None:
            self.disk.close()
        if self.remote is not None:
            self.remote.close()

"""The three tiers' page allocators behind one interface, plus tier health.

A tier is enabled when it has pages; the disk tier is healthy until a write fails or the store
reports itself degraded. Demotion goes to the next enabled, healthy tier (`lower`), else the
page is dropped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.tier import Tier

if TYPE_CHECKING:
    from tieredkv.cache.disk.store import DiskStore

logger = logging.getLogger(__name__)


class TierPools:
    """Allocation, freeing and free counts per tier (engine thread only)."""

    def __init__(self, device: DevicePool, host: HostPool, disk: DiskStore | None) -> None:
        self.device = device
        self.host = host
        self.disk = disk
        self.layout: PageLayout = device.layout
        self._disk_degraded = False

    def enabled(self, tier: Tier) -> bool:
        if tier is Tier.DEVICE:
            return True
        if tier is Tier.HOST:
            return self.host.num_pages > 0
        return self.disk is not None

    def healthy(self, tier: Tier) -> bool:
        """Enabled and able to take new copies."""
        if tier is Tier.DISK:
            return self.disk is not None and not (self._disk_degraded or self.disk.degraded)
        return self.enabled(tier)

    def mark_degraded(self, reason: str) -> None:
        if not self._disk_degraded:
            logger.warning("disk tier degraded (%s): demotions to disk become drops", reason)
        self._disk_degraded = True

    def lower(self, tier: Tier) -> Tier | None:
        """The next enabled, healthy tier below `tier`, or None (demotion becomes a drop)."""
        for candidate in Tier:
            if candidate > tier and self.healthy(candidate):
                return candidate
        return None

    def num_pages(self, tier: Tier) -> int:
        if tier is Tier.DEVICE:
            return self.device.num_pages
        if tier is Tier.HOST:
            return self.host.num_pages
        return self.disk.num_pages if self.disk is not None else 0

    def num_free(self, tier: Tier) -> int:
        if tier is Tier.DEVICE:
            return self.device.num_free
        if tier is Tier.HOST:
            return self.host.num_free
        return self.disk.num_free if self.disk is not None else 0

    def alloc(self, tier: Tier, count: int) -> list[int]:
        if tier is Tier.DEVICE:
            return self.device.alloc(count)
        if tier is Tier.HOST:
            return self.host.alloc(count)
        assert self.disk is not None
        return self.disk.alloc(count)

    def free(self, tier: Tier, pages: list[int]) -> None:
        if not pages:
            return
        if tier is Tier.DEVICE:
            self.device.free(pages)
        elif tier is Tier.HOST:
            self.host.free(pages)
        else:
            assert self.disk is not None
            self.disk.free(pages)

    def used_bytes(self, tier: Tier) -> int:
        """Allocated pages (copies, requests' pages, and destinations in flight) in bytes."""
        used = self.num_pages(tier) - self.num_free(tier)
        return used * self.layout.page_bytes

    def capacity_bytes(self, tier: Tier) -> int:
        return self.num_pages(tier) * self.layout.page_bytes

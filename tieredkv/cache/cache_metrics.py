"""Counters behind the cache's Prometheus metrics (docs/operations.md, "Metrics").

Updated only on the engine thread; the engine's metrics module reads them when it renders.
  hit_tokens           cache_hit_tokens_total{tier}
  transfer_bytes       transfer_bytes_total{from_tier,to_tier} (write-through included)
  evicted_pages        evicted_pages_total{tier,action}: "demoted" iff a copy remains lower
Disk page errors come from the store (`TieredCache.disk_page_errors()`), used and capacity
bytes from the pools (`TieredCache.tier_used_bytes()` / `tier_capacity_bytes()`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tieredkv.cache.tier import Tier

EVICTION_ACTIONS = ("demoted", "dropped")


def _per_tier() -> dict[Tier, int]:
    return dict.fromkeys(Tier, 0)


def _per_pair() -> dict[tuple[Tier, Tier], int]:
    return {(a, b): 0 for a in Tier for b in Tier if a != b}


def _per_eviction() -> dict[tuple[Tier, str], int]:
    return {(tier, action): 0 for tier in Tier for action in EVICTION_ACTIONS}


@dataclass
class CacheCounters:
    """Monotonic counters; keys are always all present (zero when a tier is unused)."""

    hit_tokens: dict[Tier, int] = field(default_factory=_per_tier)
    transfer_bytes: dict[tuple[Tier, Tier], int] = field(default_factory=_per_pair)
    evicted_pages: dict[tuple[Tier, str], int] = field(default_factory=_per_eviction)

    def count_eviction(self, tier: Tier, num_pages: int, demoted: bool) -> None:
        self.evicted_pages[tier, "demoted" if demoted else "dropped"] += num_pages

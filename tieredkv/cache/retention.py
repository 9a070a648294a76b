"""Retained prefixes: prompts sent with `prompt_cache_retention: "24h"`, whose full pages stay
reusable for `RETENTION_S` after their last use whatever else arrives, up to a budget.

A retained prefix holds one local copy of its pages: the node its last full page ends at, and
every node above it, count one retention more (`Residency.retain`), and eviction never takes
such a node's lowest local copy (`eviction`: its disk copy, or its host copy when the cache
has no disk tier). Its faster copies come and go as any other's. When the prefix is retained
its path is copied down to host and disk (where enabled), so the guarantee holds on the
lowest local tier and never on the device alone. Only a failed write or a corrupt disk record
loses a retained copy; the node stays in the tree, empty, until the prefix is released.

With a remote tier, each retention (the first and every one after) also gives the prefix's
pages `RETENTION_S` to live in Redis from that moment (`Demoter.keep_in_remote`): those not
there are written, and every one gets that expiry, set by the store's writer thread; a page
Redis was found to have lost while this replica indexed it there is forgotten and written
again at the next step (`expire`). Nothing in Redis is deleted when a prefix is released (by
the budget or on expiry): its pages' expiry bounds them. Redis's own eviction may still take
them earlier (docs/operations.md).

The budget (`--retention-budget`, in pages) is shared equally among the namespaces holding
retained prefixes: when retaining a prefix would take its namespace over its share, or all
of them over the budget, the least recently used retained prefix (of that namespace when it
is over its share) loses its guarantee first; its pages stay cached and become ordinary LRU
pages. A prefix retained again (the same prompt with "24h") moves to the most recently used
end and its 24 hours start again. Two retained prompts sharing a prefix count it twice, as
pins do. Engine thread only; the clock is the engine's (injectable in tests).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tieredkv.cache.index.match_results import PathEnd
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools

log = logging.getLogger(__name__)

RETENTION_S = 24 * 3600.0  # "24h": reusable for a day after its last use
FIGURES_PERIOD_S = 1.0  # the pages per tier are counted at most this often (a walk of paths)
LOCAL_TIERS = (Tier.DEVICE, Tier.HOST, Tier.DISK)
LOCAL_LOWER_TIERS = (Tier.HOST, Tier.DISK)

RetainedKey = tuple[str, tuple[int, ...]]  # (namespace, the full pages' token ids)


@dataclass(frozen=True)
class RetentionFigures:
    """For the metrics: retained pages per tier holding a copy, and the prefixes that lost
    their guarantee to the budget so far."""

    pages_by_tier: dict[Tier, int]
    evicted_total: int


@dataclass
class RetainedPrefix:
    namespace: str
    node: PathEnd
    num_pages: int
    last_use: float


class Retention:
    """The retained prefixes in LRU order, their budget and expiry (see the module docstring)."""

    def __init__(
        self,
        budget_pages: int,
        index: RadixIndex,
        residency: Residency,
        demoter: Demoter,
        pools: TierPools,
    ) -> None:
        self.budget_pages = budget_pages
        self.index = index
        self.residency = residency
        self.demoter = demoter
        self.pools = pools
        self.page_size = pools.layout.page_size
        self._prefixes: OrderedDict[RetainedKey, RetainedPrefix] = OrderedDict()
        self._pages_by_namespace: dict[str, int] = {}
        self.evicted_total = 0  # prefixes that lost their guarantee to the budget
        self.expired_total = 0  # prefixes whose 24 hours ran out
        self._pages_by_tier = dict.fromkeys(Tier, 0)
        self._figures_at: float | None = None

    @property
    def enabled(self) -> bool:
        return self.budget_pages > 0 and any(self.pools.enabled(t) for t in LOCAL_LOWER_TIERS)

    def retain(self, token_ids: Sequence[int], namespace: str, now: float) -> bool:
        """Retain the full pages of `token_ids` (in the tree: a finished request's prompt) from
        `now` on; False when they cannot be (no lower tier, too short, over the whole budget,
        not all in the tree)."""
        num_pages = len(token_ids) // self.page_size
        if not self.enabled or num_pages == 0 or num_pages > self.budget_pages:
            return False
        full = tuple(token_ids[: num_pages * self.page_size])
        key = (namespace, full)
        if (known := self._prefixes.get(key)) is not None:
            known.last_use = now
            self._prefixes.move_to_end(key)
            self.demoter.keep_in_remote(known.node, RETENTION_S)  # its 24 hours there too
            return True
        node = self.index.full_path(full, namespace)
        if node is None or not self.residency.path_held_in(node, LOCAL_TIERS):
            return False
        self._make_room(namespace, num_pages)
        self.residency.retain(node, +1)
        tiers = [tier for tier in LOCAL_LOWER_TIERS if self.pools.enabled(tier)]
        if (full_tier := self.demoter.copy_path(node, tiers)) is not None:
            log.debug("the %s tier has no room to retain a prefix's copy", full_tier.label)
        self.demoter.keep_in_remote(node, RETENTION_S)
        self._prefixes[key] = RetainedPrefix(namespace, node, num_pages, now)
        self._pages_by_namespace[namespace] = self.pages_in(namespace) + num_pages
        return True

    def expire(self, now: float) -> None:
        """Release the prefixes unused for `RETENTION_S` (once a step: the oldest first); write
        again the retained pages the remote store was found to have lost."""
        self._rewrite_lost(now)
        while self._prefixes:
            key, prefix = next(iter(self._prefixes.items()))
            if now - prefix.last_use < RETENTION_S:
                return
            self._release(key)
            self.expired_total += 1

    def _rewrite_lost(self, now: float) -> None:
        """The pages a retention found gone from Redis (evicted, or a restarted Redis) while
        this replica indexes them there: forget those remote copies and write them again,
        with what is left of their prefix's 24 hours."""
        remote = self.pools.remote
        if remote is None or not (lost := remote.take_lost()):
            return
        for prefix in self._prefixes.values():
            if self.demoter.forget_remote(prefix.node, lost):
                left_s = RETENTION_S - (now - prefix.last_use)
                self.demoter.keep_in_remote(prefix.node, left_s)

    def get(self, namespace: str, token_ids: Sequence[int]) -> RetainedPrefix | None:
        """The retained prefix of these full pages' tokens, if retained."""
        return self._prefixes.get((namespace, tuple(token_ids)))

    def pages_in(self, namespace: str) -> int:
        return self._pages_by_namespace.get(namespace, 0)

    def retained_pages(self) -> dict[Tier, int]:
        """Pages of retained prefixes per tier (a page shared by two prefixes counts once)."""
        return self.residency.pages_by_tier(prefix.node for prefix in self._prefixes.values())

    def figures(self, now: float) -> RetentionFigures:
        """The metrics' figures, the pages counted again at most every `FIGURES_PERIOD_S`."""
        if self._figures_at is None or now - self._figures_at >= FIGURES_PERIOD_S:
            self._pages_by_tier = self.retained_pages()
            self._figures_at = now
        return RetentionFigures(self._pages_by_tier, self.evicted_total)

    def __len__(self) -> int:
        return len(self._prefixes)

    def __contains__(self, key: RetainedKey) -> bool:
        return key in self._prefixes

    def _share(self, namespace: str) -> int:
        holders = set(self._pages_by_namespace) | {namespace}
        return self.budget_pages // len(holders)

    def _make_room(self, namespace: str, num_pages: int) -> None:
        """Release least recently used prefixes until `num_pages` more fit the namespace's
        share and the whole budget."""
        total = sum(self._pages_by_namespace.values())
        while self._prefixes and (
            self.pages_in(namespace) + num_pages > self._share(namespace)
            or total + num_pages > self.budget_pages
        ):
            own = self.pages_in(namespace) + num_pages > self._share(namespace)
            victim = next(
                (k for k, p in self._prefixes.items() if not own or p.namespace == namespace),
                None,
            )
            if victim is None:  # the namespace holds nothing: its share is below one prompt
                victim = next(iter(self._prefixes))
            total -= self._release(victim)
            self.evicted_total += 1

    def _release(self, key: RetainedKey) -> int:
        prefix = self._prefixes.pop(key)
        self.residency.retain(prefix.node, -1)
        self.residency.remove_if_empty(prefix.node)  # its copy lost (a corrupt disk record)
        left = self.pages_in(prefix.namespace) - prefix.num_pages
        if left:
            self._pages_by_namespace[prefix.namespace] = left
        else:
            del self._pages_by_namespace[prefix.namespace]
        return prefix.num_pages

"""Which copies may leave a tier, and in what order: one lazy LRU heap per tier.

A copy in tier T is evictable when its node is unlocked, has nothing in flight, is not a pinned
prefix's copy on host or disk (`tieredkv.cache.pins`), is not a retained prefix's lowest local
copy (`tieredkv.cache.retention`: its disk copy, or its host copy when it has none), and removing
the copy keeps the closure invariants (`copy_may_leave`):
  - T = disk: no child has a disk copy (disk copies are closed under "parent of");
  - the node keeps a faster copy (this one is a clean lower copy): always;
  - otherwise the node leaves the closures of T down to its next lower copy's tier L, so no
    child may have a copy faster than L (any copy at all when there is no lower copy).
Clean lower copies go first (they cost nothing to drop), then least recently used.

The heap is incremental: a node is pushed whenever it may have become evictable, and each push
bumps the node's per-tier stamp, so older entries are skipped when popped (lazy deletion).
Popping re-checks the predicate, so an entry made stale by a neighbour's change is harmless.
A match or insert only sets `last_access` on its path (no push): popping an entry whose node
was used since it was pushed re-pushes it with its current priority instead of returning it,
so nodes still leave in exact LRU order. No operation scans the tree.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier

Priority = tuple[int, int]
PINNED_TIERS = (Tier.HOST, Tier.DISK)  # where a pinned node's copies never leave
_MIN_COMPACT_LEN = 1024


def _lowest_local(record: Residence, tier: Tier) -> bool:
    return tier is Tier.DISK or (tier is Tier.HOST and Tier.DISK not in record.copies)


def copy_may_leave(record: Residence, tier: Tier) -> bool:
    """Would freeing the copy in `tier` of `record`'s node keep the closure invariants?"""
    if tier is Tier.DISK:
        return not record.children_on_disk
    if any(t < tier for t in record.copies):
        return True
    lower = min((t for t in record.copies if t > tier), default=None)
    deepest_lost = max(Tier) if lower is None else Tier(lower - 1)
    return not record.any_child_in_closure(deepest_lost)


def copy_may_move_down(record: Residence, tier: Tier) -> bool:
    """Could the copy in `tier` of `record`'s node leave by demotion (a copy one tier down
    first)? Then the node leaves only the closure of `tier`, so no child may have a copy in
    `tier` or faster."""
    if tier is Tier.DISK:
        return not record.children_on_disk
    if record.copies and min(record.copies) < tier:  # a faster copy stays
        return True
    return not record.any_child_in_closure(tier)


class LruEvictionPolicy:
    """The evictability predicate and the eviction order (see the module docstring).

    A copy is a candidate when it can leave by demotion (`copy_may_move_down`); the demoter
    frees it directly only when `copy_may_leave` also holds, else copies it down first. A node
    whose child was demoted before it (the child on host, the node still on the device) must
    stay a candidate, or the device fills with such nodes and nothing can be evicted.
    """

    @staticmethod
    def evictable(node: RadixNode, tier: Tier) -> bool:
        record = node.residence
        if not node.attached or node.parent is None or tier not in record.copies:
            return False
        if node.lock_count or record.inflight:
            return False
        if record.pin_count and tier in PINNED_TIERS:
            return False  # a pinned prefix stays on host (and on disk, to outlive a restart)
        if record.retain_count and _lowest_local(record, tier):
            return False  # a retained prefix keeps one local copy: disk, or host without it
        return copy_may_move_down(record, tier)

    @staticmethod
    def priority(node: RadixNode, tier: Tier) -> Priority:
        redundant = min(node.residence.copies) < tier  # a faster copy serves (one in `tier`)
        return (0 if redundant else 1, node.last_access)


class TierHeap:
    """Evictable copies of one tier, cheapest to evict first, with lazy deletion and lazy
    re-prioritisation (`priority` gives a node's current priority when it is popped)."""

    def __init__(
        self, tier: Tier, priority: Callable[[RadixNode, Tier], Priority] | None = None
    ) -> None:
        self.tier = tier
        self._priority = priority or LruEvictionPolicy.priority
        self._entries: list[tuple[Priority, int, int, RadixNode]] = []
        self._seq = itertools.count()
        self._compact_at = _MIN_COMPACT_LEN

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, node: RadixNode, priority: Priority) -> None:
        """(Re)insert `node`; any older entry for it in this tier becomes stale."""
        stamps = node.residence.stamps
        stamps[self.tier] += 1
        heapq.heappush(self._entries, (priority, next(self._seq), stamps[self.tier], node))
        if len(self._entries) > self._compact_at:
            self._compact()

    def peek(self, evictable: Callable[[RadixNode, Tier], bool]) -> Priority | None:
        """The priority of the first live entry whose node is still evictable (None if none),
        left in place. Entries passed on the way are dropped (stale, or their node no longer
        evictable: it is pushed again when it becomes so); an entry older than its node's
        current priority (the node was used since) goes back in with it."""
        tier = self.tier
        while self._entries:  # not aliased: a push may compact the list into a new one
            priority, _, stamp, node = self._entries[0]
            if stamp != node.residence.stamps[tier] or not evictable(node, tier):
                heapq.heappop(self._entries)
                continue
            current = self._priority(node, tier)
            if current > priority:
                heapq.heappop(self._entries)
                self.push(node, current)  # where an eager push at its last use put it
                continue
            return priority
        return None

    def pop(self, evictable: Callable[[RadixNode, Tier], bool]) -> RadixNode | None:
        """Remove and return the node of the first live, evictable entry (see `peek`)."""
        if self.peek(evictable) is None:
            return None
        node = heapq.heappop(self._entries)[3]
        node.residence.stamps[self.tier] += 1  # popped: no live entry remains
        return node

    def _compact(self) -> None:
        """Drop stale entries; amortised O(1) per push since the size at least halves."""
        tier = self.tier
        self._entries = [
            e for e in self._entries if e[2] == e[3].residence.stamps[tier] and e[3].attached
        ]
        heapq.heapify(self._entries)
        self._compact_at = max(_MIN_COMPACT_LEN, 2 * len(self._entries))

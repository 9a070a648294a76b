"""Fair tenants: which namespace gives up a page first when the device or host tier is full.

Each namespace has a share of the device and the host tier (`CacheConfig.namespace_share`): a
fixed fraction of the tier's pages, or by default an equal part among the namespaces holding
pages there now. When such a tier must make room, copies of namespaces above their share
leave first, the namespace furthest above its share first, each namespace's copies in its
own LRU order (`TierHeap`: clean lower copies, then least recently used). When no namespace
above its share has a copy that may leave, the least recently used copy of any namespace
leaves, as with plain LRU, unless the room is claimed for a namespace's optional copy (a
demotion or write-through to host, a prefetch: a `Claim`) that would take that namespace above
its share: then only its own copies may leave, and if none can, the claim gets no room (the
copy is not made, a demoted page goes further down or is dropped). Room on the device for a
request to run is never refused. A share of 1.0 is plain LRU (no namespace is ever above it),
and the tiers below host keep one heap: their order is plain LRU whatever the setting.

What a namespace holds in a tier is its committed pages there plus its copies on their way
there (they hold pool pages too: counting only committed pages let a namespace whose demotions
were still in flight look within its share and take an older namespace's pages by plain LRU).
Both are counted on its nodes' records (`Residence.usage` and `arriving`, kept by
`set_copy`/`pop_copy` and `set_inflight`/`pop_inflight`), so nothing is scanned but the
namespaces themselves: a pop costs O(namespaces with evictable copies in the tier) plus the
heap operations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.eviction import LruEvictionPolicy, Priority, TierHeap
from tieredkv.cache.tier import Tier

FAIR_TIERS = (Tier.DEVICE, Tier.HOST)
NO_FAIRNESS = 1.0  # every namespace may hold the whole tier: plain LRU


@dataclass(frozen=True)
class Claim:
    """Room asked for one namespace's optional copy: `pages` more pages of the tier."""

    root_key: bytes
    pages: int


def held(root: RadixNode, tier: Tier) -> int:
    """The pages of `tier` that the namespace of `root` holds: committed or on their way."""
    record = root.residence
    return record.usage[tier] + record.arriving[tier]


class FairTierHeap:
    """One tier's evictable copies, one lazy LRU heap per namespace; `pop` takes from the
    namespaces above their share first (see the module docstring). Same interface as
    `TierHeap`: `push(node, priority)`, `pop(evictable)`."""

    def __init__(
        self,
        tier: Tier,
        roots: Mapping[bytes, RadixNode],
        capacity: Callable[[], int],
        share: float | None,
        priority: Callable[[RadixNode, Tier], Priority] = LruEvictionPolicy.priority,
    ) -> None:
        self.tier = tier
        self._roots = roots  # the tree's namespace roots, their records count the namespace
        self._capacity = capacity  # the tier's pages
        self._share = share  # a fraction of the tier per namespace; None: an equal part
        self._priority = priority
        self._heaps: dict[bytes, TierHeap] = {}  # by namespace root key

    def __len__(self) -> int:
        return sum(len(heap) for heap in self._heaps.values())

    def push(self, node: RadixNode, priority: Priority) -> None:
        heap = self._heaps.get(node.root_key)
        if heap is None:
            heap = self._heaps[node.root_key] = TierHeap(self.tier, self._priority)
        heap.push(node, priority)

    def pop(
        self, evictable: Callable[[RadixNode, Tier], bool], claim: Claim | None = None
    ) -> RadixNode | None:
        share = self.share_pages(claim)
        # a claim beyond the claimant's share: only namespaces further above theirs than the
        # claimant would be give up pages for it, then its own, then none
        claimed = self._pages_of(claim.root_key) + claim.pages - share if claim else 0.0
        for excess, root_key in self.over_share(share):
            if excess <= claimed:
                break  # furthest first: the rest are no further above than the claimant
            node = self._heaps[root_key].pop(evictable)
            if node is not None:
                return node
        if claim is not None and claimed > 0:
            own = self._heaps.get(claim.root_key)
            return own.pop(evictable) if own is not None else None
        return self._pop_least_recent(evictable)

    def share_pages(self, claim: Claim | None = None) -> float:
        """The pages each namespace may hold in the tier before it gives up pages first (a
        claimant holding none yet counts among the namespaces an equal share divides by)."""
        if self._share is not None:
            return self._share * self._capacity()
        holding = sum(1 for root in self._roots.values() if held(root, self.tier))
        if claim is not None and not self._pages_of(claim.root_key):
            holding += 1
        return self._capacity() / max(1, holding)

    def _pages_of(self, root_key: bytes) -> int:
        root = self._roots.get(root_key)
        return held(root, self.tier) if root is not None else 0

    def over_share(self, share: float) -> list[tuple[float, bytes]]:
        """(pages above `share`, root key) of the namespaces above it with copies in this
        heap, furthest above first."""
        tier = self.tier
        excess = []
        for root_key in self._heaps:
            root = self._roots.get(root_key)
            if root is not None and held(root, tier) > share:
                excess.append((held(root, tier) - share, root_key))
        excess.sort(reverse=True)
        return excess

    def _pop_least_recent(self, evictable: Callable[[RadixNode, Tier], bool]) -> RadixNode | None:
        """Plain LRU across namespaces: the heap whose first evictable copy goes first."""
        best: tuple[Priority, TierHeap] | None = None
        for root_key, heap in list(self._heaps.items()):
            first = heap.peek(evictable)
            if first is None:
                if not len(heap):  # nothing left: a namespace gone, or all its copies used
                    del self._heaps[root_key]
                continue
            if best is None or first < best[0]:
                best = (first, heap)
        return best[1].pop(evictable) if best is not None else None


def tier_heap(
    tier: Tier,
    roots: Mapping[bytes, RadixNode],
    capacity: Callable[[], int],
    share: float | None,
) -> TierHeap | FairTierHeap:
    """The heap of `tier`: fair among namespaces on device and host unless `share` is 1.0."""
    if tier in FAIR_TIERS and share != NO_FAIRNESS:
        return FairTierHeap(tier, roots, capacity, share)
    return TierHeap(tier)

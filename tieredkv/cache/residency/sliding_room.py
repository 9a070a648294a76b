"""Sliding parts in a split host pool or disk store: which pages a copy gives one, and room.

A split host pool (`pools.split_host_pool`) and a split disk store (`disk.split_store`) hold
every page's full part and a sliding part only where a copy gave one, all from one arena of
layer pages (host memory; the store file's layer records). A copy into one gives a sliding
part to the pages the rule keeps as the tree stands (`sliding_pages.tree_kept_sliding`) that its
source holds. The tree changes after the copy: a leaf that was a chat's last turn gets the next
turn below it, a prefill chunk gets the next chunk. When the arena is short of layer pages for
the parts a copy wants, `make_room` first takes back the sliding parts no reuse point reads any
more (`reclaim`), then evicts the tier's least recently used copies, whole. The walk over the tree
runs once an eighth of the arena was given out since the last one, not at every copy.

A copy a request or a transfer is reading keeps its sliding parts: a match was cut by the gaps
it saw, and a promotion copies the parts its source held when it started.
"""

from __future__ import annotations

from collections.abc import Callable

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.sliding_pages import tree_kept_sliding, unread_sliding
from tieredkv.cache.tier import Tier


class SlidingRoom:
    """The sliding parts of a split pool of `tier`, kept in step with the tree (engine
    thread)."""

    def __init__(self, residency: Residency, pool: LayerPages, window: int, tier: Tier) -> None:
        self.residency = residency
        self.pool = pool
        self.tier = tier
        self.window = window
        self.page_size = residency.tree.page_size
        # a walk of the whole tree takes back only what changed since the last one: walk again
        # once this many parts were given since (an eighth of the arena), not at every copy
        self.reclaim_after = max(1, pool.num_sliding_pages // 8)
        self._given_since_reclaim = 0

    def wanted(self, node: RadixNode, source_gaps: frozenset[int]) -> list[int]:
        """The indexes of `node`'s pages a copy into the pool gives a sliding part: the rule
        keeps it and the source holds it."""
        kept = tree_kept_sliding(node, self.window, self.page_size)
        return [
            index for index in range(node.num_pages) if kept[index] and index not in source_gaps
        ]

    def give(
        self, node: RadixNode, source_gaps: frozenset[int], pages: list[int], reserve: int = 0
    ) -> frozenset[int]:
        """Attach sliding parts to the `pages` of a copy of `node` (`wanted`, while free beside
        the full parts of `reserve` pages still to be allocated); returns the copy's gaps: the
        source's and the pages given none."""
        wanted = self.wanted(node, source_gaps)[: self.pool.sliding_room(reserve)]
        given = self.pool.attach_sliding([pages[index] for index in wanted])
        self._given_since_reclaim += len(given)
        return source_gaps | self.pool.lacking(pages)

    def make_room(self, count: int, evict: Callable[[RadixNode], bool], pages: int = 0) -> bool:
        """Try to have room for `count` sliding parts beside the full parts of `pages` pages
        still to be allocated: take back the unread ones, then `evict` least recently used
        copies of the tier (whole: any copy's layer pages serve). True if there is room now."""
        pool = self.pool
        if pool.sliding_room(pages) >= count:
            return True
        if self._given_since_reclaim >= self.reclaim_after:
            self.reclaim()
        while pool.sliding_room(pages) < count:
            node = self.residency.pop_evictable(self.tier)
            if node is None:
                break
            if not evict(node):
                self.residency.refresh(node)
                break
        return pool.sliding_room(pages) >= count

    def reclaim(self) -> int:
        """Free the sliding parts of the tier's copies that no reuse point reads as the tree
        stands now (their pages join the copy's gaps); copies being read keep theirs. Returns
        the parts freed."""
        pool, tier, freed = self.pool, self.tier, 0
        self._given_since_reclaim = 0
        for node in self.residency.tree.iter_nodes():
            record = node.residence
            pages = record.copies.get(tier)
            if pages is None or node.lock_count or self._read_from(record):
                continue
            attached = [index for index, page in enumerate(pages) if page in pool.sliding_of]
            dropped = unread_sliding(node, attached, self.window, self.page_size)
            if dropped:
                pool.detach_sliding([pages[index] for index in dropped])
                gaps = record.sliding_gaps.get(tier, frozenset())
                record.set_gaps(tier, gaps.union(dropped))
                freed += len(dropped)
        return freed

    def _read_from(self, record: Residence) -> bool:
        return any(part.src_tier is self.tier for part in record.inflight.values())

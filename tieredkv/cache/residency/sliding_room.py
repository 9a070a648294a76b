"""Sliding parts in a split host pool: which pages a copy gives one, and room for them.

A split host pool (`pools.split_host_pool`) holds every page's full part and sliding parts for a
share of its pages. A copy into it gives a sliding part to the pages the rule keeps as the tree
stands (`sliding_pages.tree_kept_sliding`) that its source holds. The tree changes after the
copy: a leaf that was a chat's last turn gets the next turn below it, a prefill chunk gets the
next chunk. When the sliding arena is short, `make_room` first takes back the sliding parts no
reuse point reads any more (`reclaim`), then evicts the least recently used host copies that
hold sliding parts, whole: a path whose windows are gone is reused from nowhere after them, so
its full parts would hold nothing worth keeping. The walk over the tree runs once an eighth of
the arena was given out since the last one, not at every copy.

A copy a request or a transfer is reading keeps its sliding parts: a match was cut by the gaps
it saw, and a promotion copies the parts its source held when it started.
"""

from __future__ import annotations

from collections.abc import Callable

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.sliding_pages import tree_kept_sliding
from tieredkv.cache.tier import Tier


class SlidingRoom:
    """The sliding arena of a split host pool, kept in step with the tree (engine thread)."""

    def __init__(self, residency: Residency, host: SplitHostPool, window: int) -> None:
        self.residency = residency
        self.host = host
        self.window = window
        self.page_size = residency.tree.page_size
        # a walk of the whole tree takes back only what changed since the last one: walk again
        # once this many parts were given since (an eighth of the arena), not at every copy
        self.reclaim_after = max(1, host.num_sliding_pages // 8)
        self._given_since_reclaim = 0

    def wanted(self, node: RadixNode, source_gaps: frozenset[int]) -> list[int]:
        """The indexes of `node`'s pages a copy into the host gives a sliding part: the rule
        keeps it and the source holds it."""
        kept = tree_kept_sliding(node, self.window, self.page_size)
        return [
            index for index in range(node.num_pages) if kept[index] and index not in source_gaps
        ]

    def give(
        self, node: RadixNode, source_gaps: frozenset[int], pages: list[int]
    ) -> frozenset[int]:
        """Attach sliding parts to the host `pages` of a copy of `node` (`wanted`, while free);
        returns the copy's gaps: the source's and the pages given none."""
        wanted = self.wanted(node, source_gaps)
        given = self.host.attach_sliding([pages[index] for index in wanted])
        self._given_since_reclaim += len(given)
        return source_gaps | self.host.lacking(pages)

    def make_room(self, count: int, evict: Callable[[RadixNode], bool]) -> bool:
        """Try to have `count` free sliding parts: take back the unread ones, then `evict`
        least recently used host copies holding some (whole). True if `count` are free."""
        free = self.host.sliding_free
        if free.num_free >= count:
            return True
        if self._given_since_reclaim >= self.reclaim_after:
            self.reclaim()
        skipped: list[RadixNode] = []
        while free.num_free < count:
            node = self.residency.pop_evictable(Tier.HOST)
            if node is None:
                break
            if not self._holds_sliding(node.residence):
                skipped.append(node)  # evicting it frees no sliding part
                continue
            if not evict(node):
                self.residency.refresh(node)
                break
        for node in skipped:
            self.residency.refresh(node)
        return free.num_free >= count

    def reclaim(self) -> int:
        """Free the sliding parts of host copies that no reuse point reads as the tree stands
        now (their pages join the copy's gaps); copies being read keep theirs. Returns the
        parts freed."""
        host, freed = self.host, 0
        self._given_since_reclaim = 0
        for node in self.residency.tree.iter_nodes():
            record = node.residence
            pages = record.copies.get(Tier.HOST)
            if pages is None or node.lock_count or self._read_from_host(record):
                continue
            attached = [index for index, page in enumerate(pages) if page in host.sliding_of]
            if not attached:
                continue
            kept = tree_kept_sliding(node, self.window, self.page_size)
            dropped = [index for index in attached if not kept[index]]
            if dropped:
                host.detach_sliding([pages[index] for index in dropped])
                gaps = record.sliding_gaps.get(Tier.HOST, frozenset())
                record.set_gaps(Tier.HOST, gaps.union(dropped))
                freed += len(dropped)
        return freed

    def _holds_sliding(self, record: Residence) -> bool:
        pages = record.copies.get(Tier.HOST, ())
        return any(page in self.host.sliding_of for page in pages)

    @staticmethod
    def _read_from_host(record: Residence) -> bool:
        return any(part.src_tier is Tier.HOST for part in record.inflight.values())

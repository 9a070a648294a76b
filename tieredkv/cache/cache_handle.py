"""`CacheHandle`: one request's hold on the tiered cache, the only cache object a request keeps.

Through a handle a request sees tokens and device pages, never the tree. The handle keeps what
the request's prompt matched while it waits (for the queue's order and a prefetch), its
promotion, the lock on the path its pages are in, and its page table: the tree's pages first,
then the request's private ones. It is built on the facade's node-level calls, the same ones
the cache's own tests drive.

A request's life through its handle (engine thread only):
  handle = CacheHandle(cache, namespace)
  handle.look_up(tokens)              # at arrival (the remote store asked once): the queue's order
  handle.prefetch()                   # while it waits: its disk/remote pages to host, once
  handle.promote(tokens)              # at admission; False: no device room now, retry later
  ... cache.poll() until not handle.promotion_pending
  handle.take_promotion()             # the promoted prefix starts the page table
  handle.reserve(num_tokens)          # private device pages as the sequence grows
  handle.insert(computed_tokens)      # its full pages go into the tree, the lock moves down
  handle.release()                    # finish, abort, preemption: it may promote again after
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tieredkv.cache.index.match_results import MatchResult, PathEnd
from tieredkv.cache.index.token_run import TokenSequence
from tieredkv.cache.residency.promotion import PromotionTicket
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache

_NO_MATCH: Mapping[Tier, int] = dict.fromkeys(Tier, 0)


class WarmHold:
    """A finished request's pages kept on host (see `CacheHandle.hold_warm`)."""

    def __init__(self, cache: TieredCache, node: PathEnd) -> None:
        self._cache = cache
        self._node: PathEnd | None = node
        cache.hold_warm(node, +1)

    def release(self) -> None:
        """End the hold (again: nothing)."""
        if self._node is not None:
            self._cache.hold_warm(self._node, -1)
            self._node = None


@dataclass(frozen=True)
class PromotionResult:
    """A finished promotion, as the request sees it."""

    num_tokens: int  # leading tokens whose KV is in the page table's first pages
    tokens_by_tier: Mapping[Tier, int]  # each token credited to the tier it came from
    seconds: float | None  # promotion start to done, on the cache's clock


class CacheHandle:
    """One request's hold on the cache in `namespace`, holding nothing yet; engine thread only."""

    def __init__(self, cache: TieredCache, namespace: str) -> None:
        self._cache = cache
        self.namespace = namespace
        self._queued_match: MatchResult | None = None  # unlocked: a snapshot for ordering
        self._matched_by_tier = _NO_MATCH
        self._prefetched = False
        self._remote_looked_up = False
        self._promotion: PromotionTicket | None = None
        self._page_table: list[int] = []
        self._tree_pages = 0  # leading entries of the page table that the tree owns
        self._locked: PathEnd | None = None  # the deepest node of those pages

    @property
    def page_table(self) -> list[int]:
        """The device page of each page of the sequence (read it; only the handle writes it)."""
        return self._page_table

    def hold_warm(self) -> WarmHold | None:
        """Keep the tree's pages of the page table on host, as a pin does, until the hold is
        released (a conversation's think time); None when the request holds none."""
        if self._locked is None:
            return None
        return WarmHold(self._cache, self._locked)

    @property
    def num_tree_pages(self) -> int:
        """Leading pages of the page table that the tree owns (locked for the request)."""
        return self._tree_pages

    # --- while queued ----------------------------------------------------------------------

    def look_up(self, tokens: TokenSequence) -> None:
        """Match `tokens` without locking: what `matched_tokens_by_tier` and `prefetch` use.
        The first look-up also asks the remote store for the pages past the local match (one
        round trip); later ones (the queue's re-matches) see what it found in the tree."""
        if not self._remote_looked_up:
            self._remote_looked_up = True
            self._cache.look_up_remote(tokens, self.namespace)
        self._queued_match = self._cache.match(tokens, self.namespace)
        self._matched_by_tier = self._queued_match.tokens_by_tier()
        self._prefetched = False

    @property
    def matched_tokens_by_tier(self) -> Mapping[Tier, int]:
        """Tokens the last look-up matched, by the tier serving them (all 0 before one)."""
        return self._matched_by_tier

    def prefetch(self) -> None:
        """Start moving the last look-up's disk and remote pages towards host, once per
        look-up."""
        match = self._queued_match
        if self._prefetched or match is None:
            return
        if not (match.disk.num_pages or match.remote.num_pages):
            return
        self._prefetched = True
        self._cache.prefetch(match)

    # --- admission -------------------------------------------------------------------------

    def promote(self, tokens: TokenSequence) -> bool:
        """Match `tokens` again and start bringing the cached prefix to the device, all pages or
        none; False: no device room now (demotions may have started: retry after a poll)."""
        return self._start_promotion(self._cache.match(tokens, self.namespace))

    def _start_promotion(self, match: MatchResult) -> bool:
        assert self._promotion is None and not self._page_table, (
            f"promote while holding {len(self._page_table)} pages or a promotion"
        )
        ticket = self._cache.promote(match, hold_lock=True)
        if ticket is None:
            return False
        self._promotion = ticket
        return True

    @property
    def planned_pages(self) -> tuple[int | None, ...]:
        """Per page of the pending promotion's match, the device page it is in or is being
        copied to (None: not known yet); empty without a promotion."""
        return () if self._promotion is None else self._promotion.planned_pages

    @property
    def promotion_pending(self) -> bool:
        """A promotion started and not done yet (its transfers are still to be applied)."""
        return self._promotion is not None and not self._promotion.done

    def take_promotion(self) -> PromotionResult | None:
        """The done promotion's pages start the page table and its lock becomes the request's;
        None when there was no promotion to take."""
        ticket = self._promotion
        if ticket is None:
            return None
        assert ticket.done, f"take_promotion before the promotion is done: {ticket}"
        self._promotion = None
        self._page_table = list(ticket.device_pages)
        self._tree_pages = len(ticket.device_pages)
        self._locked = ticket.ready_node
        return PromotionResult(ticket.ready_len, dict(ticket.tokens_by_tier), ticket.seconds)

    # --- running ---------------------------------------------------------------------------

    def reserve(self, num_tokens: int) -> bool:
        """Device pages for the sequence's first `num_tokens` tokens: the page table grows by
        the pages it lacks, all or none; False if they are not free now."""
        needed = -(-num_tokens // self._cache.page_size) - len(self._page_table)
        if needed <= 0:
            return True
        pages = self._cache.allocate(needed)
        if pages is None:
            return False
        self._page_table.extend(pages)
        return True

    def insert(self, tokens: TokenSequence) -> None:
        """Give the tree the full pages of `tokens` (the sequence's tokens whose KV is in the
        page table). Pages another request computed first are freed and the tree's used
        instead; the lock moves to the deepest node."""
        full_pages = len(tokens) // self._cache.page_size
        if full_pages <= self._tree_pages:
            return
        # the tree pages end at the node the handle holds locked: walk on from there (an
        # insert that took no page leaves tree_pages 0 with an older lock still held)
        start = self._locked if self._tree_pages else None
        result = self._cache.insert(
            tokens,
            self.namespace,
            self._page_table[:full_pages],
            start_node=start,
            start_pages=self._tree_pages if start is not None else 0,
        )
        if result.node is not None and result.node is not self._locked:
            self._cache.lock(result.node)
            if self._locked is not None:
                self._cache.unlock(self._locked)
            self._locked = result.node
        self._page_table[: result.num_pages] = result.device_pages
        self._tree_pages = result.num_pages
        if result.duplicate_pages:
            self._cache.free(result.duplicate_pages)
        if self._locked is not None and self._tree_pages:
            self._cache.window_passed(self._locked, self._tree_pages * self._cache.page_size)

    def release(self) -> None:
        """Free the private pages and the lock (a done promotion is taken first). The handle
        holds nothing afterwards and may promote again."""
        assert not self.promotion_pending, "release during a promotion: its lock has no owner"
        self.take_promotion()
        private = self._page_table[self._tree_pages :]
        if private:
            self._cache.free(private)
        if self._locked is not None:
            self._cache.unlock(self._locked)
        self._page_table = []
        self._tree_pages = 0
        self._locked = None

    # --- forks -----------------------------------------------------------------------------

    def share_resident(self, tokens: TokenSequence) -> int | None:
        """Start the page table with the cached prefix of `tokens` when all of it is on the
        device now: its pages are shared with the tree and locked, as a cache hit's are. The
        tokens it covers, or None (the handle holds nothing) when some of it is on another tier
        or it cannot be taken now."""
        match = self._cache.match(tokens, self.namespace)
        if any(n for tier, n in match.tokens_by_tier().items() if tier is not Tier.DEVICE):
            return None
        if not self._start_promotion(match):
            return None
        result = self.take_promotion()  # resident pages: done at once
        return 0 if result is None else result.num_tokens

    def copy_pages_from(self, other: CacheHandle, first: int, end: int) -> None:
        """Copy the KV of `other`'s pages `first:end` into this handle's pages at the same
        places (both reserved; this handle's are its own): a fork's partial prompt page."""
        sources, targets = other.page_table[first:end], self._page_table[first:end]
        assert len(sources) == len(targets) == end - first, (
            f"copy of pages {first}:{end} between tables of {len(sources)} and {len(targets)}"
        )
        assert first >= self._tree_pages, f"page {first} is the tree's, not the handle's"
        self._cache.device_pool.copy_pages(sources, targets)

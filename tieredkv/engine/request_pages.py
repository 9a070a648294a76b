"""A request's pages in the tiered cache: match, promote, grow, insert, release.

Keeps the engine's step free of cache bookkeeping. With prefix reuse off (`--no-cache`) the
same calls only allocate and free private device pages: nothing is matched or inserted.
"""

from __future__ import annotations

from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.engine.request import Request


class RequestPages:
    def __init__(self, cache: TieredCache, page_size: int, reuse_prefixes: bool) -> None:
        self.cache = cache
        self.page_size = page_size
        self.reuse = reuse_prefixes

    def on_arrival(self, request: Request) -> None:
        """Match for the queue's priority (the disk part is prefetched if the request waits)."""
        if not self.reuse:
            return
        request.waiting_match = self.cache.match(request.packed_tokens, request.spec.namespace)
        request.prefetched = False

    def prefetch_while_waiting(self, request: Request) -> None:
        """A request that stays queued starts reading the disk part of its match towards host,
        once. Not at arrival: a request admitted in the same step promotes disk -> device
        itself, and a prefetch beside it would read the same pages a second time."""
        match = request.waiting_match
        if request.prefetched or match is None or not match.disk.num_pages:
            return
        request.prefetched = True
        self.cache.prefetch(match)

    def admit(self, request: Request) -> bool:
        """Start bringing the request's cached prefix to the device; False: no room now."""
        if not self.reuse:
            return True
        match = self.cache.match(request.packed_tokens, request.spec.namespace)
        ticket = self.cache.promote(match, hold_lock=True)
        if ticket is None:
            return False
        request.promotion = ticket
        return True

    def apply_transfers(self, promoting: list[Request]) -> list[Request]:
        """Apply finished transfers; return the promoting requests whose pages are ready,
        their page tables taken from their promotions."""
        self.cache.poll()
        ready = [r for r in promoting if r.promotion is not None and r.promotion.done]
        for request in ready:
            self.take_promotion(request)
        return ready

    def take_promotion(self, request: Request) -> None:
        """The promoted prefix becomes the start of the page table; its lock the request's."""
        ticket = request.promotion
        request.promotion = None
        if ticket is None:
            return
        request.page_table = list(ticket.device_pages)
        request.tree_pages = len(ticket.device_pages)
        request.locked_node = ticket.ready_node
        request.kv_len = ticket.ready_len
        if request.num_preemptions == 0:  # usage reports the first admission's reuse
            request.cached_tokens = ticket.ready_len
            request.cached_by_tier = {tier: ticket.tokens_by_tier[tier] for tier in Tier}
            request.promotion_seconds = ticket.seconds

    def grow(self, request: Request, end: int) -> bool:
        """Device pages for the sequence's tokens up to `end`; False if none free now."""
        needed = -(-end // self.page_size) - len(request.page_table)
        if needed <= 0:
            return True
        pages = self.cache.allocate(needed)
        if pages is None:
            return False
        request.page_table.extend(pages)
        return True

    def insert_computed(self, request: Request) -> None:
        """Give the tree the request's full pages whose KV is computed; move its lock down."""
        full_pages = request.kv_len // self.page_size
        if not self.reuse or full_pages <= request.tree_pages:
            return
        tokens = request.packed_tokens[: full_pages * self.page_size]
        # the tree pages end at the node the request holds locked: walk on from there (an
        # insert that took no page leaves tree_pages 0 with an older lock still held)
        start = request.locked_node if request.tree_pages else None
        result = self.cache.insert(
            tokens,
            request.spec.namespace,
            request.page_table[:full_pages],
            start_node=start,
            start_pages=request.tree_pages if start is not None else 0,
        )
        if result.node is not None and result.node is not request.locked_node:
            self.cache.lock(result.node)
            if request.locked_node is not None:
                self.cache.unlock(request.locked_node)
            request.locked_node = result.node
        request.page_table[: result.num_pages] = result.device_pages
        request.tree_pages = result.num_pages
        if result.duplicate_pages:
            self.cache.free(result.duplicate_pages)

    def release(self, request: Request, keep_computed: bool) -> None:
        """Free the request's private pages and its lock (its computed pages go to the tree
        first when `keep_computed`). The request holds no pages afterwards."""
        if keep_computed:
            self.insert_computed(request)
        if request.private_pages:
            self.cache.free(request.private_pages)
        if request.locked_node is not None:
            self.cache.unlock(request.locked_node)
        request.page_table = []
        request.tree_pages = 0
        request.locked_node = None
        request.kv_len = 0

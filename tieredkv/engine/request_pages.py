"""A request's pages in the tiered cache, through its `CacheHandle`: look up, promote, grow,
insert, release.

Keeps the request's tokens and its cache handle in step. With prefix reuse off (`--no-cache`)
the same calls only allocate and free private device pages: nothing is matched or inserted.
"""

from __future__ import annotations

from tieredkv.cache.cache_handle import WarmHold
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.engine.request import Request


class RequestPages:
    def __init__(self, cache: TieredCache, page_size: int, reuse_prefixes: bool) -> None:
        self.cache = cache
        self.page_size = page_size
        self.reuse = reuse_prefixes
        # the device tier's size in pages, and what pages held take of it (a split device
        # pool's pages without a sliding part take less than a page)
        self.device_pages = cache.tier_capacity_bytes(Tier.DEVICE) // cache.layout.page_bytes
        self.held_pages = cache.device_pages_held

    def on_arrival(self, request: Request) -> None:
        """Match for the queue's priority (the disk part is prefetched if the request waits)."""
        if self.reuse:
            request.kv.look_up(request.packed_tokens)

    def prefetch_while_waiting(self, request: Request) -> None:
        """A request that stays queued starts reading the disk part of its match towards host,
        once. Not at arrival: a request admitted in the same step promotes disk -> device
        itself, and a prefetch beside it would read the same pages a second time."""
        request.kv.prefetch()

    def admit(self, request: Request) -> bool:
        """Start bringing the request's cached prefix to the device; False: no room now. A
        request that must score its prompt (echo with logprobs) computes it all instead."""
        if not self.reuse or request.needs_prompt_logits:
            return True
        return request.kv.promote(request.packed_tokens)

    def share_prompt(self, parent: Request, fork: Request) -> bool:
        """Give `fork` the KV of `parent`'s prompt, computed once: the full pages the tree
        holds are shared (the fork locks them as a cache hit would), the rest (the partial
        last page) copied into pages of its own. False when a page it needs is not on the
        device or not free now; the fork then holds nothing."""
        prompt_len = len(parent.spec.prompt_ids)
        shared = 0
        if self.reuse:
            self.insert_computed(parent)  # the prompt's full pages, locked by the parent
            resident = fork.kv.share_resident(fork.packed_tokens)
            if resident is None:
                return False
            shared = resident
        if not fork.kv.reserve(prompt_len):
            fork.kv.release()
            return False
        first, end = shared // self.page_size, -(-prompt_len // self.page_size)
        fork.kv.copy_pages_from(parent.kv, first, end)
        fork.kv_len = prompt_len
        return True

    def apply_transfers(self, promoting: list[Request]) -> list[Request]:
        """Apply finished transfers; return the promoting requests whose pages are ready,
        their page tables taken from their promotions."""
        self.cache.poll()
        ready = [r for r in promoting if not r.kv.promotion_pending]
        for request in ready:
            self.take_promotion(request)
        return ready

    def transfers_in_flight(self) -> bool:
        """Transfers are in flight: the demotions among them free device pages soon."""
        return self.cache.transfers_in_flight() > 0

    def take_promotion(self, request: Request) -> None:
        """The promoted prefix becomes the start of the page table (and of the KV)."""
        result = request.kv.take_promotion()
        if result is None:
            return
        request.kv_len = result.num_tokens
        if request.num_preemptions == 0:  # usage reports the first admission's reuse
            request.cached_tokens = result.num_tokens
            request.cached_by_tier = {tier: result.tokens_by_tier[tier] for tier in Tier}
            request.promotion_seconds = result.seconds

    def grow(self, request: Request, end: int) -> bool:
        """Device pages for the sequence's tokens up to `end`; False if none free now."""
        return request.kv.reserve(end)

    def insert_computed(self, request: Request) -> None:
        """Give the tree the request's full pages whose KV is computed; move its lock down."""
        full_pages = request.kv_len // self.page_size
        if not self.reuse or full_pages <= request.kv.num_tree_pages:
            return  # checked before packing: most steps complete no page
        request.kv.insert(request.packed_tokens[: full_pages * self.page_size])

    def release(
        self, request: Request, keep_computed: bool, keep_warm: bool = False
    ) -> WarmHold | None:
        """Free the request's private pages and its lock (its computed pages go to the tree
        first when `keep_computed`). The request holds no pages afterwards. With `keep_warm`,
        returns a hold that keeps its tree pages on host until released."""
        if keep_computed:
            self.insert_computed(request)
        hold = request.kv.hold_warm() if keep_warm else None
        request.kv.release()
        request.kv_len = 0
        return hold

"""Promotion: bringing a match's host and disk pages to the device, and prefetching disk pages
towards host while a request waits.

A promotion locks its match for its lifetime (the path cannot be evicted or demoted), allocates
all the device pages it needs at once or none, shares transfers already on their way to the
device (two requests needing the same pages wait on one copy), and is done when every transfer
it waits for was applied. A read that fails shortens the ready prefix; it is never an error.
"""

from __future__ import annotations

from collections.abc import Callable

from tieredkv.cache.cache_results import MatchResult, PromotionTicket
from tieredkv.cache.demotion import Demoter
from tieredkv.cache.mover import TransferTicket
from tieredkv.cache.radix_tree import RadixNode
from tieredkv.cache.residency import Residency
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools


def match_path(match: MatchResult) -> list[RadixNode]:
    """The match's nodes as the tree holds them now (splits since the match are included)."""
    node = match.last_node
    if node is None or not node.attached:
        return []
    return node.path()


class Promoter:
    """Starts promotions and prefetches; finalizes promotions (engine thread only)."""

    def __init__(
        self,
        pools: TierPools,
        residency: Residency,
        demoter: Demoter,
        lock: Callable[[RadixNode], None],
        unlock: Callable[[RadixNode], None],
        clock: Callable[[], float],
    ) -> None:
        self.pools = pools
        self.residency = residency
        self.demoter = demoter
        self.lock = lock
        self.unlock = unlock
        self.clock = clock

    def promote(self, match: MatchResult, hold_lock: bool = False) -> PromotionTicket | None:
        path = match_path(match)
        ticket = PromotionTicket(match, self.clock(), hold_lock=hold_lock)
        if not path:
            self._finish(ticket, [])
            return ticket
        assert match.last_node is not None
        self.lock(match.last_node)
        needed: list[RadixNode] = []
        shared: dict[int, TransferTicket] = {}
        for node in path:
            if Tier.DEVICE in node.copies:
                source = Tier.DEVICE
            elif Tier.DEVICE in node.inflight:
                part = node.inflight[Tier.DEVICE]
                source = part.src_tier
                if not part.ticket.done:  # else it arrived and commits with its parent
                    shared[part.ticket.id] = part.ticket
            elif node.copies:
                source = node.fastest_copy()
                needed.append(node)
            else:
                break  # an emptied node (its read failed): the rest is a miss
            ticket.source_tiers.extend([source] * node.num_pages)  # type: ignore[list-item]
        num_pages = sum(node.num_pages for node in needed)
        if num_pages and not self.demoter.make_room(Tier.DEVICE, num_pages):
            self.unlock(match.last_node)
            return None
        started = self.residency.start_copy(needed, Tier.DEVICE, drop_source=False)
        for transfer in [*started, *shared.values()]:
            ticket.transfers.append(transfer)
            ticket.waiting_on.add(transfer.id)
            transfer.waiters.append(ticket)
        if not ticket.waiting_on:
            self._finish(ticket, path)
        return ticket

    def transfer_applied(self, transfer: TransferTicket) -> list[PromotionTicket]:
        """Note that `transfer` was applied; return the promotions that are now done."""
        finished = []
        for ticket in transfer.waiters:
            ticket.waiting_on.discard(transfer.id)
            if not ticket.waiting_on and not ticket.done:
                self._finish(ticket, match_path(ticket.match))
                finished.append(ticket)
        transfer.waiters.clear()
        return finished

    def _finish(self, ticket: PromotionTicket, path: list[RadixNode]) -> None:
        pages: list[int] = []
        ready_node = None
        for node in path:
            if Tier.DEVICE not in node.copies or len(pages) >= ticket.match.num_pages:
                break
            pages.extend(node.copies[Tier.DEVICE])
            ready_node = node
        pages = pages[: ticket.match.num_pages]
        if ticket.hold_lock and ready_node is not None:
            # locked before the match's lock goes, so no transfer applied later in the same
            # poll can take the ready pages away; the caller owns this lock
            ticket.ready_node = ready_node
            self.lock(ready_node)
        ticket.num_ready_pages = len(pages)
        ticket.device_pages = tuple(pages)
        page_size = ticket.match.page_size
        for tier in ticket.source_tiers[: len(pages)]:
            ticket.tokens_by_tier[tier] += page_size
            self.residency.counters.hit_tokens[tier] += page_size
        ticket.done = True
        ticket.completed_at = self.clock()
        if path:
            assert ticket.match.last_node is not None
            self.unlock(ticket.match.last_node)

    def prefetch(self, match: MatchResult, max_pages: int) -> list[TransferTicket]:
        """Start copying up to `max_pages` leading disk-only pages of the match to host.

        Nothing when the host tier is disabled or has no room now; the copies keep their
        disk pages, and the next `promote` reads them from host."""
        if not self.pools.enabled(Tier.HOST):
            return []
        chosen: list[RadixNode] = []
        budget = max_pages
        for node in match_path(match):
            if node.in_closure(Tier.HOST):
                continue
            if not budget or Tier.DISK not in node.copies:
                break
            if node.num_pages > budget:
                node = self.residency.tree.split(node, budget)  # take the head only
                self.residency.refresh(node)
            chosen.append(node)
            budget -= node.num_pages
        if not chosen:
            return []
        assert match.last_node is not None
        self.lock(match.last_node)  # making room must not take the path's own host copies
        try:
            if not self.demoter.make_room(Tier.HOST, sum(n.num_pages for n in chosen)):
                return []
            return self.residency.start_copy(chosen, Tier.HOST, drop_source=False)
        finally:
            self.unlock(match.last_node)

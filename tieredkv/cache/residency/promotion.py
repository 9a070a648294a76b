"""Promotion: bringing a match's host and disk pages to the device, and prefetching disk pages
towards host while a request waits.

A promotion locks its match for its lifetime (the path cannot be evicted or demoted), makes
room for all the device pages it needs at once or starts nothing, shares transfers already on
their way to the device (two requests needing the same pages wait on one copy), and is done when
every transfer it waits for was applied. A read that fails shortens the ready prefix; it is
never an error.

Pages a prefetch is still reading towards host are not read from the store a second time: the
promotion waits for that read, then copies them host -> device, and the path's pages below
them from where they are (its second stage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tieredkv.cache.index.match_results import MatchResult
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.node_transfers import NodeTransfers
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_queue import TransferTicket


class PathLocks(Protocol):
    """Locks on a node's path (`RadixIndex`): a locked path is never evicted or demoted."""

    def lock(self, node: RadixNode) -> None: ...

    def unlock(self, node: RadixNode) -> None: ...


@dataclass(eq=False)
class PromotionTicket:
    """Bringing a match's host and disk pages to the device (see `TieredCache.promote`).

    Done once every transfer it waits for was applied by `TieredCache.poll`. Then
    `num_ready_pages` leading pages of the match are on the device (`device_pages`): fewer than
    matched when a read failed (the rest is a miss, to prefill). `tokens_by_tier` credits each
    ready token to the tier it was served or promoted from. Times come from the cache's clock.
    """

    match: MatchResult = field(repr=False)
    created_at: float
    transfers: list[TransferTicket] = field(default_factory=list)
    source_tiers: list[Tier] = field(default_factory=list, repr=False)  # per page of the match
    done: bool = False
    completed_at: float | None = None
    num_ready_pages: int = 0
    device_pages: tuple[int, ...] = ()
    tokens_by_tier: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    waiting_on: set[int] = field(default_factory=set)  # transfer ticket ids not yet applied
    staged: bool = False  # waits on prefetches to host; then copies their pages to the device
    hold_lock: bool = False  # when done, lock `ready_node` for the caller
    # per page of the match, the device page it is in or is being copied to when the
    # promotion started (None: not known yet, or not coming); see `planned_device_pages`
    planned_pages: tuple[int | None, ...] = field(default=(), repr=False)
    ready_node: RadixNode | None = None  # deepest ready node; locked for the caller if hold_lock

    @property
    def ready_len(self) -> int:
        """Tokens of the prompt whose KV is on the device once done."""
        return self.num_ready_pages * self.match.page_size

    @property
    def seconds(self) -> float | None:
        """Created to completed, for `promotion_seconds`."""
        return None if self.completed_at is None else self.completed_at - self.created_at


def match_path(match: MatchResult) -> list[RadixNode]:
    """The match's nodes as the tree holds them now (splits since the match are included)."""
    node = match.last_node
    if node is None or not node.attached:
        return []
    return node.path()


@dataclass
class CopyPlan:
    """What bringing a path to the device takes: nodes to copy now (`needed`), transfers to
    the device already under way (`shared`), and the pages left to the second stage
    (`staged_pages`: those a prefetch is reading to host, waiting on `prefetches`, and those
    below them); `source_tiers` credits each page to its tier."""

    needed: list[RadixNode] = field(default_factory=list)
    shared: dict[int, TransferTicket] = field(default_factory=dict)
    staged_pages: int = 0
    prefetches: dict[int, TransferTicket] = field(default_factory=dict)
    source_tiers: list[Tier] = field(default_factory=list)


def planned_device_pages(path: list[RadixNode], num_pages: int) -> tuple[int | None, ...]:
    """Per page of the path's first `num_pages`, the device page holding it or copied to now
    (None: neither yet, e.g. left to a second stage or not held at all)."""
    pages: list[int | None] = []
    for node in path:
        if len(pages) >= num_pages:
            break
        record = node.residence
        if Tier.DEVICE in record.copies:
            pages.extend(record.copies[Tier.DEVICE])
        elif Tier.DEVICE in record.inflight:
            pages.extend(record.inflight[Tier.DEVICE].dst_pages)
        else:
            pages.extend([None] * node.num_pages)
    return tuple(pages[:num_pages])


def _plan_copies(path: list[RadixNode], stage_prefetched: bool) -> CopyPlan:
    """Classify the path's nodes, root first, up to the first that holds nothing (its read
    failed: the rest is a miss). With `stage_prefetched`, a node on its way to host is left to
    that read rather than read from its store again, and so is every node below it: a node
    may head for the device only once its parent does (parents commit first)."""
    plan = CopyPlan()
    for node in path:
        record = node.residence
        prefetch = record.inflight.get(Tier.HOST)
        if Tier.DEVICE in record.copies:
            source = Tier.DEVICE
        elif Tier.DEVICE in record.inflight:
            part = record.inflight[Tier.DEVICE]
            source = part.src_tier
            if not part.ticket.done:  # else it arrived and commits with its parent
                plan.shared[part.ticket.id] = part.ticket
        elif stage_prefetched and prefetch is not None and not prefetch.ticket.done:
            source = prefetch.src_tier
            plan.staged_pages += node.num_pages
            plan.prefetches[prefetch.ticket.id] = prefetch.ticket
        elif plan.staged_pages and record.copies:  # below a staged node: the second stage's
            source = record.fastest_copy()  # type: ignore[assignment]
            plan.staged_pages += node.num_pages
        elif record.copies:
            source = record.fastest_copy()  # type: ignore[assignment]
            plan.needed.append(node)
        else:
            break
        plan.source_tiers.extend([source] * node.num_pages)
    return plan


class Promoter:
    """Starts promotions and prefetches; finalizes promotions (engine thread only)."""

    def __init__(
        self,
        residency: Residency,
        transfers: NodeTransfers,
        demoter: Demoter,
        locks: PathLocks,
        counters: CacheCounters,
        clock: Callable[[], float],
    ) -> None:
        self.pools = residency.pools
        self.residency = residency
        self.transfers = transfers
        self.demoter = demoter
        self.locks = locks
        self.counters = counters
        self.clock = clock
        self._waiters: dict[int, list[PromotionTicket]] = {}  # by transfer ticket id

    def promote(self, match: MatchResult, hold_lock: bool = False) -> PromotionTicket | None:
        path = match_path(match)
        ticket = PromotionTicket(match, self.clock(), hold_lock=hold_lock)
        if not path:
            self._finish(ticket, [])
            return ticket
        assert match.last_node is not None
        self.locks.lock(match.last_node)
        plan = _plan_copies(path, stage_prefetched=True)
        ticket.source_tiers = plan.source_tiers
        num_pages = sum(node.num_pages for node in plan.needed) + plan.staged_pages
        if num_pages and not self.demoter.make_room(Tier.DEVICE, num_pages):
            self.locks.unlock(match.last_node)
            return None
        ticket.staged = plan.staged_pages > 0
        started = self.transfers.start_copy(plan.needed, Tier.DEVICE, frees_source=False)
        self._wait_for(ticket, [*started, *plan.shared.values(), *plan.prefetches.values()])
        ticket.planned_pages = planned_device_pages(path, match.num_pages)
        if not ticket.waiting_on:
            self._finish(ticket, path)
        return ticket

    def _wait_for(self, ticket: PromotionTicket, transfers: list[TransferTicket]) -> None:
        for transfer in transfers:
            ticket.transfers.append(transfer)
            ticket.waiting_on.add(transfer.id)
            self._waiters.setdefault(transfer.id, []).append(ticket)

    def _start_second_stage(self, ticket: PromotionTicket) -> None:
        """The prefetches it waited for were applied: copy what they brought to host (and
        whatever else of the path is still below the device) to the device. Pages for which
        there is no device room now stay a miss."""
        ticket.staged = False
        path = match_path(ticket.match)
        plan = _plan_copies(path, stage_prefetched=False)
        needed = plan.needed
        num_pages = sum(node.num_pages for node in needed)
        if num_pages and not self.demoter.make_room(Tier.DEVICE, num_pages):
            needed = []  # the room made at admission was taken since: the rest is computed
        started = self.transfers.start_copy(needed, Tier.DEVICE, frees_source=False)
        self._wait_for(ticket, [*started, *plan.shared.values()])

    def transfer_applied(self, transfer: TransferTicket) -> list[PromotionTicket]:
        """Note that `transfer` was applied; return the promotions that are now done."""
        finished = []
        for ticket in self._waiters.pop(transfer.id, []):
            ticket.waiting_on.discard(transfer.id)
            if not ticket.waiting_on and ticket.staged:
                self._start_second_stage(ticket)
            if not ticket.waiting_on and not ticket.done:
                self._finish(ticket, match_path(ticket.match))
                finished.append(ticket)
        return finished

    def _finish(self, ticket: PromotionTicket, path: list[RadixNode]) -> None:
        pages: list[int] = []
        ready_node = None
        for node in path:
            device_pages = node.residence.device_pages()
            if device_pages is None or len(pages) >= ticket.match.num_pages:
                break
            pages.extend(device_pages)
            ready_node = node
        pages = pages[: ticket.match.num_pages]
        if ticket.hold_lock and ready_node is not None:
            # locked before the match's lock goes, so no transfer applied later in the same
            # poll can take the ready pages away; the caller owns this lock
            ticket.ready_node = ready_node
            self.locks.lock(ready_node)
        ticket.num_ready_pages = len(pages)
        ticket.device_pages = tuple(pages)
        page_size = ticket.match.page_size
        for tier in ticket.source_tiers[: len(pages)]:
            ticket.tokens_by_tier[tier] += page_size
            self.counters.on_hit(tier, page_size)
        ticket.done = True
        ticket.completed_at = self.clock()
        if path:
            assert ticket.match.last_node is not None
            self.locks.unlock(ticket.match.last_node)

    def prefetch(self, match: MatchResult, max_pages: int) -> list[TransferTicket]:
        """Start copying up to `max_pages` leading pages of the match that only a store (disk,
        else the remote tier) holds to host.

        Nothing when the host tier is disabled or has no room now; the copies keep their
        store pages, and the next `promote` reads them from host."""
        if not self.pools.enabled(Tier.HOST):
            return []
        chosen: list[RadixNode] = []
        budget = max_pages
        for node in match_path(match):
            if node.residence.in_closure(Tier.HOST):
                continue
            if not budget or not any(tier.is_store for tier in node.residence.copies):
                break
            if node.num_pages > budget:
                node = self.residency.split(node, budget)  # take the head only
            chosen.append(node)
            budget -= node.num_pages
        if not chosen:
            return []
        assert match.last_node is not None
        self.locks.lock(match.last_node)  # making room must not take the path's own host copies
        try:
            num_pages, claimant = sum(n.num_pages for n in chosen), chosen[0].root_key
            if not self.demoter.make_room(Tier.HOST, num_pages, claimant):
                return []
            # a split host pool without room for a node's sliding parts now would copy it with
            # gaps, and the match would be cut there: the promotion reads it from the store
            # straight to the device instead
            for index, node in enumerate(chosen):
                if not self.demoter.sliding_room_for([node], num_pages):
                    chosen = chosen[:index]
                    break
            return self.transfers.start_copy(chosen, Tier.HOST, frees_source=False)
        finally:
            self.locks.unlock(match.last_node)

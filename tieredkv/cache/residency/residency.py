"""Residency: which tiers hold each node's pages, and the transfers that change it.

Rules kept here (engine thread only):
  - A copy is committed only after its parent has a committed copy in the same or a faster
    tier (disk: a committed disk copy). A copy that arrives early waits (`PartState.ARRIVED`),
    so completions apply parents before children whatever order the workers finish in.
  - A failed copy frees its destination; whatever depended on it (children's copies in flight
    towards that tier, or disk copies below a bad record) is detached and freed too, so the
    closure invariants hold after every completion.
  - A demotion frees its source only when applied, and only if the node could still leave
    that tier (unlocked, no child needing it); otherwise the source stays as the serving copy.

Demotion and promotion use it through its methods; `presence(node)` says in one place what a
node has in each tier: present, arriving or leaving.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.residency.eviction import LruEvictionPolicy, copy_may_leave
from tieredkv.cache.residency.fair_share import Claim, FairTierHeap, tier_heap
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.transfer.mover import (
    Mover,
    PartState,
    TicketState,
    TransferPart,
    TransferTicket,
)
from tieredkv.cache.transfer.page_copier import PageCopier

Commit = tuple[RadixNode, Tier]  # a copy committed in a tier


class Presence(enum.Enum):
    """What a node has in one tier."""

    PRESENT = "present"  # a committed copy, staying
    ARRIVING = "arriving"  # a copy on its way (copying, or arrived and waiting for the parent)
    LEAVING = "leaving"  # a committed copy that a demotion in flight frees when applied


def page_records(node: RadixNode, tree: RadixTree) -> list[PageRecord]:
    """The disk identity of each page of `node`: key, parent page's key, tokens. The first
    time a page needs its key (`RadixTree.page_keys`)."""
    keys = tree.page_keys(node)
    parents = [tree.parent_key(node), *keys[:-1]]
    return [
        PageRecord(key, parent_key, node.page_ids(i, tree.page_size))
        for i, (key, parent_key) in enumerate(zip(keys, parents, strict=True))
    ]


class Residency:
    """Starts transfers, applies their completions and keeps the per-tier heaps current."""

    def __init__(
        self,
        tree: RadixTree,
        pools: TierPools,
        copier: PageCopier,
        mover: Mover,
        counters: CacheCounters,
        clock: Callable[[], float],
        namespace_share: float | None = None,
    ) -> None:
        """`namespace_share`: each namespace's share of the device and host tiers when they
        make room (`fair_share`; None: an equal part among the namespaces holding pages)."""
        self.tree = tree
        self.pools = pools
        self.copier = copier
        self.mover = mover
        self.counters = counters
        self.clock = clock
        self._policy = LruEvictionPolicy()
        self._heaps = {
            tier: tier_heap(tier, tree.roots, partial(pools.num_pages, tier), namespace_share)
            for tier in Tier
        }
        self._pending_free = dict.fromkeys(Tier, 0)  # source pages in-flight demotions free
        self._commits: list[Commit] = []  # since the last `apply`

    # --- what is where ---------------------------------------------------------------------

    def presence(self, node: RadixNode) -> dict[Tier, Presence]:
        """Per tier where `node` has pages: present, arriving or leaving."""
        leaving = {
            part.src_tier
            for part in node.inflight.values()
            if part.ticket.frees_source  # type: ignore[attr-defined]
        }
        found = {
            tier: Presence.LEAVING if tier in leaving else Presence.PRESENT for tier in node.copies
        }
        found.update(dict.fromkeys(node.inflight, Presence.ARRIVING))
        return found

    def pending_free(self, tier: Tier) -> int:
        """Pages of `tier` that demotions in flight free when applied."""
        return self._pending_free[tier]

    def transfers_in_flight(self) -> bool:
        return bool(self.mover.in_flight)

    # --- heaps -----------------------------------------------------------------------------

    def evictable(self, node: RadixNode, tier: Tier) -> bool:
        """May `node`'s copy in `tier` leave it now, by demotion at least (see `eviction`)?"""
        return self._policy.evictable(node, tier)

    def pop_evictable(self, tier: Tier, claim: Claim | None = None) -> RadixNode | None:
        """The cheapest copy to evict from `tier` now (see `eviction` and `fair_share`: a
        `claim` for a namespace's optional copy may find none), or None."""
        heap = self._heaps[tier]
        if isinstance(heap, FairTierHeap):
            return heap.pop(self._policy.evictable, claim)
        return heap.pop(self._policy.evictable)

    def refresh(self, node: RadixNode | None) -> None:
        """Push `node` into the heap of every tier where it is evictable now."""
        if node is None or node.parent is None or not node.attached:
            return
        for tier in node.copies:
            if self._policy.evictable(node, tier):
                self._heaps[tier].push(node, self._policy.priority(node, tier))

    def split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages (see `RadixTree.split`); returns the head."""
        head = self.tree.split(node, num_pages)
        self.refresh(head)
        return head

    # --- what the index reports (`TreeEvents`) ---------------------------------------------

    def device_copy_adopted(self, node: RadixNode) -> None:
        self.refresh(node.parent)
        self.commit_waiting_children(node)

    def released(self, node: RadixNode) -> None:
        self.refresh(node)
        self.remove_if_empty(node, cascade=False)

    @contextmanager
    def pinned(self, node: RadixNode) -> Iterator[None]:
        """Keep `node`'s path out of eviction while room is made for its own transfer."""
        self.tree.lock_path(node, +1)
        try:
            yield
        finally:
            for changed in self.tree.lock_path(node, -1):
                self.refresh(changed)

    # --- starting transfers ----------------------------------------------------------------

    def start_copy(
        self, nodes: list[RadixNode], dst: Tier, frees_source: bool
    ) -> list[TransferTicket]:
        """Copy each node's fastest committed copy to `dst` (room must already be free); a
        demotion (`frees_source`) frees each source when applied.

        One ticket per source tier; nodes keep their order (parents first)."""
        by_source: dict[Tier, list[RadixNode]] = {}
        for node in nodes:
            source = node.fastest_copy()
            assert source is not None and source != dst and dst not in node.inflight, node
            by_source.setdefault(source, []).append(node)
        return [self._submit(src, dst, group, frees_source) for src, group in by_source.items()]

    def _submit(
        self, src: Tier, dst: Tier, nodes: list[RadixNode], frees_source: bool
    ) -> TransferTicket:
        num_pages = sum(node.num_pages for node in nodes)
        ticket = self.mover.new_ticket(src, dst, num_pages, frees_source)
        dst_pages = self.pools.alloc(dst, num_pages)
        src_pages: list[int] = []
        records: list[PageRecord] = []
        for node in nodes:
            offset = len(src_pages)
            part_dst = dst_pages[offset : offset + node.num_pages]
            part = TransferPart(node, ticket, src, dst, list(node.copies[src]), part_dst, offset)
            node.set_inflight(dst, part)
            ticket.parts.append(part)
            src_pages.extend(part.src_pages)
            if src.is_store or dst.is_store:
                records.extend(page_records(node, self.tree))
        if frees_source:
            self._pending_free[src] += num_pages
        self.mover.submit(ticket, self.copier.job(src, dst, src_pages, dst_pages, records))
        return ticket

    # --- applying completions --------------------------------------------------------------

    def apply(self, ticket: TransferTicket) -> list[Commit]:
        """Commit or roll back every part of a ticket whose copy finished. Returns the copies
        committed since the last call: this ticket's, the waiting children's they let commit,
        and any an insert let commit since (`device_copy_adopted`)."""
        failed = ticket.error is not None or ticket.page_ok is None
        if failed and ticket.dst_tier is Tier.DISK:
            self.pools.mark_degraded(Tier.DISK, f"write failed: {ticket.error}")
        arrived_pages = 0
        for part in list(ticket.parts):
            if ticket.frees_source:
                self._pending_free[part.src_tier] -= len(part.src_pages)
            if part.state is PartState.DETACHED:
                self.pools.free(part.dst_tier, part.dst_pages)
                continue
            if failed:
                self._fail(part, bad_record=False)
                continue
            page_ok = ticket.page_ok[part.offset : part.offset + len(part.dst_pages)]  # type: ignore[index]
            if not all(page_ok):
                arrived_pages += self._fail_from(part, page_ok.index(False))
                continue
            arrived_pages += len(part.dst_pages)
            part.state = PartState.ARRIVED
            self._try_commit(part)
        ticket.state = TicketState.FAILED if failed else TicketState.DONE
        ticket.completed_at = self.clock()
        self.counters.on_transfer(
            ticket.src_tier, ticket.dst_tier, arrived_pages * self.pools.layout.page_bytes
        )
        for tier, pages in ticket.release:
            self.pools.free(tier, pages)
        ticket.release.clear()
        self.mover.retire(ticket)
        commits, self._commits = self._commits, []
        return commits

    def _try_commit(self, part: TransferPart) -> None:
        node, dst = part.node, part.dst_tier
        if not node.may_commit(dst):
            return  # the parent's copy commits first and then commits this one
        node.pop_inflight(dst)
        node.set_copy(dst, part.dst_pages)
        self._commits.append((node, dst))
        if part.ticket.frees_source:
            self._finish_demotion(node, part.src_tier)
        self.refresh(node)
        self.refresh(node.parent)
        self.commit_waiting_children(node)

    def commit_waiting_children(self, node: RadixNode) -> None:
        """Commit the children's arrived copies that `node`'s copies now allow."""
        for child in list(node.children.values()):
            for child_part in list(child.inflight.values()):
                if child_part.state is PartState.ARRIVED:
                    self._try_commit(child_part)

    def _finish_demotion(self, node: RadixNode, src: Tier) -> None:
        """Free the demoted source if the node may still leave `src`; else keep it."""
        if src not in node.copies or node.lock_count:
            return
        if any(part.src_tier == src for part in node.inflight.values()):
            return
        if not copy_may_leave(node, src):
            return
        self.counters.on_eviction(src, node.num_pages, demoted=True)
        self.pools.free(src, node.pop_copy(src))
        self.refresh(node.parent)

    def _fail_from(self, part: TransferPart, first_bad: int) -> int:
        """Pages from `first_bad` on failed verification: commit the head, fail the rest (a
        miss from there). Returns the pages that arrived."""
        if first_bad:
            head = self.tree.split(part.node, first_bad)  # `part` keeps the tail
            head_part = head.inflight[part.dst_tier]
            head_part.state = PartState.ARRIVED
            self._try_commit(head_part)
        self._fail(part, bad_record=part.src_tier.is_store)
        return first_bad

    def _fail(self, part: TransferPart, bad_record: bool) -> None:
        node = part.node
        node.pop_inflight(part.dst_tier)
        self.pools.free(part.dst_tier, part.dst_pages)
        if bad_record and part.src_tier in node.copies:  # a bad record, a remote page gone
            self.free_copy(node, part.src_tier, count_as=None)
        self.enforce_closure(node)
        self.commit_waiting_children(node)  # a copy it kept may be all they waited for
        self.refresh(node)
        self.remove_if_empty(node)

    def _doom(self, part: TransferPart) -> None:
        """Detach a part from its node; its destination is freed now or when it is applied."""
        part.node.pop_inflight(part.dst_tier)
        if part.state is PartState.ARRIVED:
            self.pools.free(part.dst_tier, part.dst_pages)
        part.state = PartState.DETACHED

    # --- dropping copies -------------------------------------------------------------------

    def free_copy(self, node: RadixNode, tier: Tier, count_as: bool | None) -> None:
        """Free `node`'s copy in `tier`; copies being read from it are detached first and the
        pages freed only when those reads finish. `count_as`: demoted, dropped, or None."""
        pages = node.pop_copy(tier)
        readers = [part for part in node.inflight.values() if part.src_tier == tier]
        live = [part.ticket for part in readers if part.state is PartState.COPYING]
        for part in readers:
            self._doom(part)
        if live:
            live[0].release.append((tier, pages))
        else:
            self.pools.free(tier, pages)
        if count_as is not None:
            self.counters.on_eviction(tier, len(pages), demoted=count_as)

    def enforce_closure(self, node: RadixNode) -> None:
        """Detach or free whatever below `node` the closure invariants no longer allow."""
        for child in list(node.children.values()):
            for tier, part in list(child.inflight.items()):
                allowed = node.has_disk_copy() if tier is Tier.DISK else node.in_closure(tier)
                if not allowed:
                    self._doom(part)
            kept = [
                tier
                for tier in child.copies
                if (Tier.DISK in node.copies if tier is Tier.DISK else node.in_closure(tier))
            ]
            for tier in list(child.copies):
                if tier not in kept:  # demoted iff the child keeps a copy below
                    self.free_copy(child, tier, count_as=any(t > tier for t in kept))
            self.enforce_closure(child)
            self.remove_if_empty(child, cascade=False, merge=False)
            self.refresh(child)

    def remove_if_empty(self, node: RadixNode, cascade: bool = True, merge: bool = True) -> bool:
        """Detach a node left with no copy, no transfer, no child, no lock and no pin; then try its
        parent (which may now be empty too, or mergeable with its last child). True if `node`
        left the tree (its parent, or the run it merged into, is refreshed)."""
        removed = False
        while node.attached and node.parent is not None:
            if node.copies or node.inflight or node.children or node.lock_count or node.pin_count:
                break
            parent = node.parent
            self.tree.remove(node)
            removed = True
            if merge and parent.parent is not None and self.tree.can_merge(parent):
                self.refresh(self.tree.merge(parent))
            else:
                self.refresh(parent)
            if not cascade:
                break
            node = parent
        return removed

"""`NodeTransfers`: copying nodes' pages between tiers, and applying each copy's outcome.

Starting: each node's fastest committed copy is copied to the destination tier (a store's
copy that frees nothing reads the host copy where there is one), one transfer_queue ticket per
source tier, nodes in path order (parents first); each node's part of a ticket is
its transfer in flight (`Residence.inflight`). A demotion (`frees_source`) counts its source
pages as pending free until applied.

Applying (engine thread, `TieredCache.poll`): a part whose pages arrived intact commits as soon
as its parent's copy allows (`Residency.try_commit`; else when the parent commits). A failed
copy frees its destination; a page that failed verification commits the pages before it and
fails the rest (a miss from there), and a bad store record or a remote page gone loses that
source copy too. Whatever relied on what was lost is detached or freed
(`Residency.enforce_closure`), so the closure invariants hold after every completion.
"""

from __future__ import annotations

from collections.abc import Callable

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.residency.residency import Commit, Residency
from tieredkv.cache.residency.sliding_room import SlidingRoom
from tieredkv.cache.sliding_pages import tree_kept_sliding
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs
from tieredkv.cache.transfer.transfer_queue import (
    PartState,
    TicketState,
    TransferPart,
    TransferQueue,
    TransferTicket,
)


def page_records(
    node: RadixNode, tree: RadixTree, gaps: frozenset[int] = frozenset()
) -> list[PageRecord]:
    """The store identity of each page of `node`: key, parent page's key, tokens, and whether
    the copy keeps its sliding part (not the pages of `gaps`). The first time a page needs
    its key (`RadixTree.page_keys`)."""
    keys = tree.page_keys(node)
    parents = [tree.parent_key(node), *keys[:-1]]
    return [
        PageRecord(key, parent_key, node.page_ids(i, tree.page_size), sliding_held=i not in gaps)
        for i, (key, parent_key) in enumerate(zip(keys, parents, strict=True))
    ]


class NodeTransfers:
    """Starts copies of nodes between tiers and applies the finished ones (engine thread)."""

    def __init__(
        self,
        residency: Residency,
        transfer_jobs: TransferJobs,
        transfer_queue: TransferQueue,
        clock: Callable[[], float],
    ) -> None:
        self.residency = residency
        self.pools = residency.pools
        self.transfer_jobs = transfer_jobs
        self.transfer_queue = transfer_queue
        self.clock = clock
        self._pending_free = dict.fromkeys(Tier, 0)  # source pages in-flight demotions free
        # the sliding parts of a split host pool and a split disk store (a tier without one:
        # every page there holds all its layers)
        self.sliding_rooms: dict[Tier, SlidingRoom] = {}
        window = residency.sliding_window
        for tier, pool in ((Tier.HOST, self.pools.host), (Tier.DISK, self.pools.disk)):
            if isinstance(pool, LayerPages) and window is not None:
                self.sliding_rooms[tier] = SlidingRoom(residency, pool, window, tier)

    def pending_free(self, tier: Tier) -> int:
        """Pages of `tier` that demotions in flight free when applied."""
        return self._pending_free[tier]

    def in_flight(self) -> bool:
        """Transfers started and not applied yet?"""
        return bool(self.transfer_queue.in_flight)

    # --- starting --------------------------------------------------------------------------

    def start_copy(
        self, nodes: list[RadixNode], dst: Tier, frees_source: bool, reserve_pages: int = 0
    ) -> list[TransferTicket]:
        """Copy each node's fastest committed copy to `dst` (room must already be free); a
        demotion (`frees_source`) frees each source when applied. A copy that frees nothing
        reads the copy `Residence.copy_source` names (a store is written from host).
        `reserve_pages`: pages a copy started next allocates in `dst`; the sliding parts given
        here leave the layer pages of their full parts free.

        One ticket per source tier; nodes keep their order (parents first)."""
        by_source: dict[Tier, list[RadixNode]] = {}
        for node in nodes:
            record = node.residence
            source = record.fastest_copy() if frees_source else record.copy_source(dst)
            assert source is not None and source != dst and dst not in record.inflight, node
            by_source.setdefault(source, []).append(node)
        tickets = []
        to_come = sum(node.num_pages for node in nodes) + reserve_pages
        for src, group in by_source.items():
            to_come -= sum(node.num_pages for node in group)  # the groups after this one's
            tickets.append(self._submit(src, dst, group, frees_source, to_come))
        return tickets

    def _submit(
        self, src: Tier, dst: Tier, nodes: list[RadixNode], frees_source: bool, reserve_pages: int
    ) -> TransferTicket:
        num_pages = sum(node.num_pages for node in nodes)
        ticket = self.transfer_queue.new_ticket(src, dst, num_pages, frees_source)
        dst_pages = self.pools.alloc(dst, num_pages)
        src_pages: list[int] = []
        records: list[PageRecord] = []
        for node in nodes:
            offset = len(src_pages)
            part_dst = dst_pages[offset : offset + node.num_pages]
            record = node.residence
            part = TransferPart(node, ticket, src, dst, list(record.copies[src]), part_dst, offset)
            part.sliding_gaps = self._gaps_of_copy(node, src, dst, part_dst, reserve_pages)
            if dst is Tier.REMOTE and part.sliding_gaps and self.pools.remote is not None:
                self.pools.remote.note_gaps(part_dst[index] for index in part.sliding_gaps)
            record.set_inflight(dst, part)
            ticket.parts.append(part)
            src_pages.extend(part.src_pages)
            if src.is_store or dst.is_store:
                records.extend(page_records(node, self.residency.tree, part.sliding_gaps))
        if frees_source:
            self._pending_free[src] += num_pages
        self.transfer_queue.submit(
            ticket, self.transfer_jobs.job(src, dst, src_pages, dst_pages, records)
        )
        return ticket

    def _gaps_of_copy(
        self, node: RadixNode, src: Tier, dst: Tier, dst_pages: list[int], reserve_pages: int = 0
    ) -> frozenset[int]:
        """The pages whose sliding part a copy of `node` to `dst_pages` does not carry: its
        source's gaps (a split device pool frees their parts at once), in a split host pool or
        disk store those the rule drops or no slot is left for, and in a remote tier that keeps
        parts those the rule drops as the tree stands."""
        gaps = node.residence.sliding_gaps.get(src, frozenset())
        room, window = self.sliding_rooms.get(dst), self.residency.sliding_window
        if room is not None:
            return room.give(node, gaps, dst_pages, reserve_pages)
        device = self.pools.device
        if dst is Tier.DEVICE and gaps and isinstance(device, SplitDevicePool):
            device.detach_sliding([dst_pages[index] for index in sorted(gaps)])  # nothing to hold
        remote = self.pools.remote
        if dst is Tier.REMOTE and window is not None and remote is not None and remote.keeps_parts:
            kept = tree_kept_sliding(node, window, self.residency.tree.page_size)
            return gaps.union(index for index in range(node.num_pages) if not kept[index])
        return gaps

    # --- applying --------------------------------------------------------------------------

    def apply(self, ticket: TransferTicket) -> list[Commit]:
        """Commit or roll back every part of a ticket whose copy finished. Returns the copies
        committed since the last call: this ticket's, the waiting children's they let commit,
        and any an insert let commit since (`Residency.adopt_device_copy`)."""
        pools, residency = self.pools, self.residency
        failed = ticket.error is not None or ticket.page_ok is None
        if failed and ticket.dst_tier is Tier.DISK:
            pools.mark_degraded(Tier.DISK, f"write failed: {ticket.error}")
        arrived_pages = 0
        for part in list(ticket.parts):
            if ticket.frees_source:
                self._pending_free[part.src_tier] -= len(part.src_pages)
            if part.state is PartState.DETACHED:
                pools.free(part.dst_tier, part.dst_pages)
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
            residency.try_commit(part)
        ticket.state = TicketState.FAILED if failed else TicketState.DONE
        ticket.completed_at = self.clock()
        residency.counters.on_transfer(
            ticket.src_tier, ticket.dst_tier, arrived_pages * pools.layout.page_bytes
        )
        for tier, pages in ticket.release:
            pools.free(tier, pages)
        ticket.release.clear()
        self.transfer_queue.retire(ticket)
        return residency.take_commits()

    def _fail_from(self, part: TransferPart[RadixNode], first_bad: int) -> int:
        """Pages from `first_bad` on failed verification: commit the head, fail the rest (a
        miss from there). Returns the pages that arrived."""
        if first_bad:
            head = self.residency.tree.split(part.node, first_bad)  # `part` keeps the tail
            head_part = head.residence.inflight[part.dst_tier]
            head_part.state = PartState.ARRIVED
            self.residency.try_commit(head_part)
        self._fail(part, bad_record=part.src_tier.is_store)
        return first_bad

    def _fail(self, part: TransferPart[RadixNode], bad_record: bool) -> None:
        node, residency = part.node, self.residency
        record = node.residence
        record.pop_inflight(part.dst_tier)
        self.pools.free(part.dst_tier, part.dst_pages)
        if bad_record and part.src_tier in record.copies:  # a bad record, a remote page gone
            residency.free_copy(node, part.src_tier, count_as=None)
        residency.enforce_closure(node)
        residency.commit_waiting_children(node)  # a copy it kept may be all they waited for
        residency.refresh(node)
        residency.remove_if_empty(node)

"""Applying a finished transfer: commit each part whose pages arrived intact, roll back the rest.

A part whose bytes are in commits as soon as its parent's copy allows (`Residency.try_commit`;
else when the parent commits). A failed copy frees its destination; a page that failed
verification commits the pages before it and fails the rest (a miss from there), and a bad
store record or a remote page gone loses that source copy too. Whatever relied on what was lost
is detached or freed (`Residency.enforce_closure`), so the closure invariants hold after every
completion. A demotion's source pages are freed when applied, if the node may still leave.
"""

from __future__ import annotations

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.residency import Commit, Residency
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.mover import PartState, TicketState, TransferPart, TransferTicket


def apply_transfer(residency: Residency, ticket: TransferTicket) -> list[Commit]:
    """Commit or roll back every part of a ticket whose copy finished. Returns the copies
    committed since the last call: this ticket's, the waiting children's they let commit, and
    any an insert let commit since (`Residency.adopt_device_copy`)."""
    pools = residency.pools
    failed = ticket.error is not None or ticket.page_ok is None
    if failed and ticket.dst_tier is Tier.DISK:
        pools.mark_degraded(Tier.DISK, f"write failed: {ticket.error}")
    arrived_pages = 0
    for part in list(ticket.parts):
        if ticket.frees_source:
            residency.demotion_applied(part.src_tier, len(part.src_pages))
        if part.state is PartState.DETACHED:
            pools.free(part.dst_tier, part.dst_pages)
            continue
        if failed:
            _fail(residency, part, bad_record=False)
            continue
        page_ok = ticket.page_ok[part.offset : part.offset + len(part.dst_pages)]  # type: ignore[index]
        if not all(page_ok):
            arrived_pages += _fail_from(residency, part, page_ok.index(False))
            continue
        arrived_pages += len(part.dst_pages)
        part.state = PartState.ARRIVED
        residency.try_commit(part)
    ticket.state = TicketState.FAILED if failed else TicketState.DONE
    ticket.completed_at = residency.clock()
    residency.counters.on_transfer(
        ticket.src_tier, ticket.dst_tier, arrived_pages * pools.layout.page_bytes
    )
    for tier, pages in ticket.release:
        pools.free(tier, pages)
    ticket.release.clear()
    residency.mover.retire(ticket)
    return residency.take_commits()


def _fail_from(residency: Residency, part: TransferPart[RadixNode], first_bad: int) -> int:
    """Pages from `first_bad` on failed verification: commit the head, fail the rest (a miss
    from there). Returns the pages that arrived."""
    if first_bad:
        head = residency.tree.split(part.node, first_bad)  # `part` keeps the tail
        head_part = head.residence.inflight[part.dst_tier]
        head_part.state = PartState.ARRIVED
        residency.try_commit(head_part)
    _fail(residency, part, bad_record=part.src_tier.is_store)
    return first_bad


def _fail(residency: Residency, part: TransferPart[RadixNode], bad_record: bool) -> None:
    node = part.node
    record = node.residence
    record.pop_inflight(part.dst_tier)
    residency.pools.free(part.dst_tier, part.dst_pages)
    if bad_record and part.src_tier in record.copies:  # a bad record, a remote page gone
        residency.free_copy(node, part.src_tier, count_as=None)
    residency.enforce_closure(node)
    residency.commit_waiting_children(node)  # a copy it kept may be all they waited for
    residency.refresh(node)
    residency.remove_if_empty(node)

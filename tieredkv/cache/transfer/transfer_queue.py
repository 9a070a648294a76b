"""The transfer queue: every transfer between tiers is a `TransferTicket` run by an executor.

Worker threads (or CUDA copy streams) only copy bytes and report an outcome; the outcome is
queued here and applied to the tree by the engine thread in `TieredCache.poll()`. A ticket pins
its source pages (the source copy stays committed until the ticket is applied) and owns its
destination pages until then.
"""

from __future__ import annotations

import enum
import functools
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tieredkv.cache.tier import STORE_TIERS, Tier
from tieredkv.cache.transfer.executors import TransferExecutor, TransferJob


class TicketState(enum.Enum):
    PENDING = "pending"  # copying, or copied and not yet applied by the engine thread
    DONE = "done"  # applied: every page that arrived intact is committed
    FAILED = "failed"  # applied: nothing committed (an I/O error)


class PartState(enum.Enum):
    """A transfer part's life: copying, then committed (it leaves its node's record), or
    arrived and waiting for its parent's copy to commit first; detached from its node at any
    point (its source or closure went away), and then its destination is freed."""

    COPYING = "copying"  # the bytes are on their way
    ARRIVED = "arrived"  # the bytes are in; commits once the parent's copy allows
    DETACHED = "detached"  # no longer its node's: the destination is freed when applied


NodeT = TypeVar("NodeT")  # what a part copies pages for (a node of the index): never read here


@dataclass(eq=False)
class TransferPart(Generic[NodeT]):
    """One node's pages inside a ticket (`offset` indexes the ticket's page order)."""

    node: NodeT
    ticket: TransferTicket
    src_tier: Tier
    dst_tier: Tier
    src_pages: list[int]
    dst_pages: list[int]
    offset: int
    state: PartState = PartState.COPYING
    # the pages (indexes in the part) whose sliding part the copy does not carry
    sliding_gaps: frozenset[int] = frozenset()

    def split_head(self, num_pages: int, head: NodeT) -> TransferPart[NodeT]:
        """Cut off the first `num_pages` pages as a part of the same ticket for `head`."""
        part = TransferPart(
            head,
            self.ticket,
            self.src_tier,
            self.dst_tier,
            self.src_pages[:num_pages],
            self.dst_pages[:num_pages],
            self.offset,
            self.state,
            frozenset(index for index in self.sliding_gaps if index < num_pages),
        )
        self.sliding_gaps = frozenset(
            index - num_pages for index in self.sliding_gaps if index >= num_pages
        )
        self.src_pages = self.src_pages[num_pages:]
        self.dst_pages = self.dst_pages[num_pages:]
        self.offset += num_pages
        self.ticket.parts.append(part)
        return part


@dataclass(eq=False)
class TransferTicket:
    """A pending copy of pages from one tier to another.

    `created_at` / `completed_at` come from the cache's clock (completed = applied on the engine
    thread). `page_ok[i]` says whether page i of the ticket arrived intact. A demotion
    (`frees_source`) frees each source copy when applied, if that copy may still leave.
    """

    id: int
    src_tier: Tier
    dst_tier: Tier
    num_pages: int
    frees_source: bool
    created_at: float
    completed_at: float | None = None
    state: TicketState = TicketState.PENDING
    page_ok: list[bool] | None = None
    error: BaseException | None = None
    parts: list[TransferPart[Any]] = field(default_factory=list)
    release: list[tuple[Tier, list[int]]] = field(default_factory=list)  # freed when applied

    @property
    def done(self) -> bool:
        return self.state is not TicketState.PENDING

    def __repr__(self) -> str:
        return (
            f"TransferTicket(id={self.id}, {self.src_tier.label}->{self.dst_tier.label}, "
            f"pages={self.num_pages}, {self.state.value})"
        )


class TransferQueue:
    """Submits copy jobs to executors and queues their outcomes for the engine thread.

    Disk and remote transfers go to `disk_executor` (a pool of I/O threads), the others to
    `memory_executor` (a worker pool on CPU, copy streams on CUDA).
    """

    def __init__(
        self,
        memory_executor: TransferExecutor,
        disk_executor: TransferExecutor,
        clock: Callable[[], float],
    ) -> None:
        self.memory_executor = memory_executor
        self.disk_executor = disk_executor
        self.clock = clock
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._arrived: list[tuple[TransferTicket, list[bool] | None, BaseException | None]] = []
        self.in_flight: dict[int, TransferTicket] = {}  # submitted, not yet applied
        self._listeners: list[Callable[[], None]] = []

    def new_ticket(
        self, src_tier: Tier, dst_tier: Tier, num_pages: int, frees_source: bool
    ) -> TransferTicket:
        return TransferTicket(
            next(self._ids), src_tier, dst_tier, num_pages, frees_source, self.clock()
        )

    def submit(self, ticket: TransferTicket, job: TransferJob) -> None:
        self.in_flight[ticket.id] = ticket
        uses_io = bool(STORE_TIERS & {ticket.src_tier, ticket.dst_tier})
        executor = self.disk_executor if uses_io else self.memory_executor
        executor.submit(ticket, job, functools.partial(self._report, ticket))

    def retire(self, ticket: TransferTicket) -> None:
        """`ticket` was applied: it is no longer in flight."""
        del self.in_flight[ticket.id]

    def add_listener(self, notify: Callable[[], None]) -> None:
        """Call `notify()` (from a worker thread) whenever a copy finishes: lets the engine
        thread sleep on one event for both new requests and finished transfers."""
        self._listeners.append(notify)

    def _report(
        self, ticket: TransferTicket, page_ok: list[bool] | None, error: BaseException | None
    ) -> None:
        """Called by a worker thread when the bytes are in (or the copy failed)."""
        with self._cond:
            self._arrived.append((ticket, page_ok, error))
            self._cond.notify_all()
        for notify in self._listeners:
            notify()

    def drain(self) -> list[TransferTicket]:
        """Take the tickets whose copies finished, outcome stored on each (engine thread)."""
        with self._cond:
            arrived, self._arrived = self._arrived, []
        for ticket, page_ok, error in arrived:
            ticket.page_ok = page_ok
            ticket.error = error
        return [ticket for ticket, _, _ in arrived]

    def wait(self, timeout: float | None) -> bool:
        """Block until some copy finished or `timeout` passed; True if one is ready."""
        with self._cond:
            # SYNC: the engine thread waits for a worker to report a finished copy.
            return self._cond.wait_for(lambda: bool(self._arrived), timeout)

    def close(self) -> None:
        """Let copies in flight finish, then stop the executors."""
        self.memory_executor.shutdown()
        self.disk_executor.shutdown()

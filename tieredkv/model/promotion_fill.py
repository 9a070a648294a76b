"""Filling a promoted sequence's workspace while its pages are still being read.

A request whose cached prefix is on disk waits for the store's reads, which leave the cores
mostly idle; copying the whole prefix from the pool into a workspace afterwards would add
tens of MB of copying to the turn, after the read. Instead, when its
promotion starts the engine reserves it an arena slot with the pool page each prefix page will
land in (`expect`), the transfer jobs reports device pages as they land verified (`landed`, on its
reading threads), and each is copied into the slot at its position then, beside the reads
still in flight. The slot is the one a released sequence left holding the prefix's head, if
its head is on the device already, else one whose memory a sequence wrote that far already:
a first touch of a slot's memory faults it in page by page, which on a VM costs more than
the copy itself and would hold up the reading threads.

The sequence's first chunk takes the slot (`take`) with the positions that hold their page:
a position counts only if the sequence's page there is the page that landed, under the same
allocation stamp (`DevicePool.stamps`). A page whose read failed never lands; one freed and
allocated again since has a new stamp; a page the promotion did not read (already on the
device, or brought up from host) never lands: all of those are copied from the pool then, as
before. The slot's memory is never served for a position it does not hold.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.workspace import Workspace, WorkspaceArena

_UNSET = -1  # a position no page has landed in (stamps start at 0)


@dataclass(eq=False)
class _Expected:
    """One promoting sequence's slot: the page expected at each position, the stamp of the
    page that landed there (`_UNSET`: none yet), and copies running into it now."""

    workspace: Workspace
    pages: np.ndarray  # int64 per page position, _UNSET where no landing is expected
    stamps: np.ndarray = field(init=False)
    copying: int = 0

    def __post_init__(self) -> None:
        self.stamps = np.full(len(self.pages), _UNSET, dtype=np.int64)


class PromotionFills:
    """Arena slots filled while promotions read (engine thread: `expect`, `take`, `cancel`;
    the transfer jobs' threads: `landed`)."""

    def __init__(self, pool: DevicePool, arena: WorkspaceArena) -> None:
        self.pool = pool
        self.arena = arena
        self._lock = threading.Condition()
        self._expected: dict[int, _Expected] = {}  # by sequence
        self._by_page: dict[int, list[tuple[_Expected, int]]] = {}  # (slot, position) per page
        self.landed_pages = 0  # pages copied into a slot as they landed

    def expect(self, seq_id: int, pages: Sequence[int | None]) -> bool:
        """Reserve a slot for `seq_id`, whose prefix page i lands in pool page `pages[i]`
        (None: not read by this promotion). False (nothing reserved) when no slot is free."""
        if seq_id in self._expected or not any(page is not None for page in pages):
            return False
        page_size = self.pool.layout.page_size
        head = list(itertools.takewhile(lambda page: page is not None, pages))
        # a released slot may still hold the head already on the device (see WorkspaceArena)
        workspace = self.arena.take(len(pages) * page_size, head, len(head) * page_size, True)
        if workspace is None:
            return False
        planned = np.array([_UNSET if p is None else p for p in pages], dtype=np.int64)
        expected = _Expected(workspace, planned)
        with self._lock:
            self._expected[seq_id] = expected
            for position, page in enumerate(planned.tolist()):
                if page != _UNSET:
                    self._by_page.setdefault(page, []).append((expected, position))
        return True

    def landed(self, pages: Sequence[int]) -> None:
        """Pool pages `pages` now hold their verified KV: copy each into the slots expecting
        it (on the calling thread; copies into different slots or positions run at once)."""
        with self._lock:
            targets: dict[int, tuple[_Expected, list[int], list[int]]] = {}
            for page in pages:
                for expected, position in self._by_page.get(page, ()):
                    entry = targets.setdefault(id(expected), (expected, [], []))
                    entry[1].append(page)
                    entry[2].append(position)
            for expected, _, _ in targets.values():
                expected.copying += 1
        for expected, landed_pages, positions in targets.values():
            try:
                expected.workspace.fill_pages(self.pool, landed_pages, positions)
            finally:
                with self._lock:
                    expected.copying -= 1
                    # the allocation's stamp, set before the read began (the engine thread
                    # allocated the page, then submitted the job that wrote it)
                    expected.stamps[positions] = self.pool.stamps[landed_pages]
                    self.landed_pages += len(positions)
                    self._lock.notify_all()

    def take(self, seq_id: int, page_ids: Sequence[int]) -> tuple[Workspace, np.ndarray] | None:
        """The slot reserved for `seq_id` and, per page position, whether it holds the KV of
        `page_ids` there (same page, same allocation); None when none was reserved."""
        expected = self._retire(seq_id)
        if expected is None:
            return None
        workspace = expected.workspace
        kept = len(workspace.mirrors)  # the head a released slot held at `expect`
        if kept:
            head = np.asarray(page_ids[:kept], dtype=np.int64)
            still = workspace.mirrors.matching_pages(self.pool, head)
            if still < kept:
                workspace.roll_back(still * self.pool.layout.page_size, self.pool.layout.page_size)
        n = min(len(page_ids), len(expected.pages))
        pages = np.asarray(page_ids[:n], dtype=np.int64)
        holds = (expected.pages[:n] == pages) & (expected.stamps[:n] == self.pool.stamps[pages])
        holds &= expected.stamps[:n] != _UNSET
        return workspace, holds

    def cancel(self, seq_id: int) -> None:
        """The sequence ended before its first chunk: its slot is free again, holding nothing."""
        expected = self._retire(seq_id)
        if expected is not None:
            self.arena.give(expected.workspace)

    def _retire(self, seq_id: int) -> _Expected | None:
        with self._lock:
            expected = self._expected.pop(seq_id, None)
            if expected is None:
                return None
            for page in expected.pages.tolist():
                waiting = self._by_page.get(page)
                if waiting is None:
                    continue
                waiting[:] = [entry for entry in waiting if entry[0] is not expected]
                if not waiting:
                    del self._by_page[page]
            # SYNC: a copy into the slot that already started finishes before the slot is
            # handed on (a promotion is done only after its reads, so this rarely waits)
            self._lock.wait_for(lambda: expected.copying == 0)
        return expected

    def __len__(self) -> int:
        return len(self._expected)

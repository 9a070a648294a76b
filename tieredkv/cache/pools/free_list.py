"""A pool's free list of page ids, and `PagePool`: what every tier's pool offers (engine thread
only)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tieredkv.cache.tier import Tier
from tieredkv.errors import OutOfPagesError

logger = logging.getLogger(__name__)


class PageFreeList:
    """LIFO free list over page ids 0..num_pages-1, with double-free detection.

    Pops from the end: a fresh list hands out the lowest ids first, in contiguous runs. Pages
    move in batches: the free ids are one list (sliced off by `alloc`, extended by `free`) and
    the used ids one set (updated by set operations), so a batch costs C loops, not a Python
    step per page. A page freed twice, or twice in one batch, is an AssertionError that leaves
    the list as it was.
    """

    def __init__(self, num_pages: int, tier_label: str) -> None:
        self.num_pages = num_pages
        self._label = tier_label
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def alloc(self, count: int) -> list[int]:
        """Take `count` pages, all or nothing."""
        free = self._free
        if count > len(free):
            raise OutOfPagesError(f"{self._label} pool: asked for {count} pages, {len(free)} free")
        if count <= 0:
            return []
        pages = free[-count:]
        del free[-count:]
        pages.reverse()  # the order popping one by one gives
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        used = self._used
        before = len(used)
        used.difference_update(pages)
        if before - len(used) != len(pages):
            self._refuse(pages)
        self._free.extend(pages)

    def _refuse(self, pages: list[int]) -> None:
        """Undo a free that named a free page, one page twice or no page at all; say which."""
        already_free = set(self._free)
        valid = range(self.num_pages)
        self._used.update(page for page in pages if page in valid and page not in already_free)
        seen: set[int] = set()
        for page in pages:
            if page not in valid:
                raise AssertionError(f"{self._label} page {page} is not one of {self.num_pages}")
            if page in already_free or page in seen:
                raise AssertionError(f"{self._label} page {page} freed twice")
            seen.add(page)
        raise AssertionError(f"{self._label} pages {pages}: a free that did not add up")

    def take(self, pages: Iterable[int]) -> None:
        """Mark these free pages used (a disk store's live records at a warm restart); the
        rest stay free, in their order."""
        pages = list(pages)
        taken = set(pages)
        if len(taken) != len(pages) or not taken.isdisjoint(self._used):
            seen: set[int] = set()
            for page in pages:
                if page in self._used or page in seen:
                    raise AssertionError(f"{self._label} page {page} taken while in use")
                seen.add(page)
        if taken and (min(taken) < 0 or max(taken) >= self.num_pages):
            raise AssertionError(f"{self._label} pages {sorted(taken)}: not all of its own")
        self._used |= taken
        self._free = [page for page in self._free if page not in taken]

    def is_free(self, page: int) -> bool:
        assert 0 <= page < self.num_pages, f"{self._label} page {page} of {self.num_pages}"
        return page not in self._used

    def used_pages(self) -> list[int]:
        return sorted(self._used)


class PagePool:
    """What every tier's pool offers: `num_pages` pages of `page_bytes` behind a `PageFreeList`,
    and the tier's health. Subclasses own the memory (a tensor, a file) and set `tier`,
    `num_pages`, `page_bytes` and `free_list`; a pool without pages is a disabled tier.

    `degraded` is the tier's one health flag: once set (`mark_degraded`), the tier takes no new
    copies and demotions to it become drops; what it holds is still served.
    """

    tier: Tier
    num_pages: int
    page_bytes: int
    free_list: PageFreeList
    degraded: bool = False

    @property
    def num_free(self) -> int:
        return self.free_list.num_free

    @property
    def num_used(self) -> int:
        return self.free_list.num_used

    @property
    def capacity_bytes(self) -> int:
        return self.num_pages * self.page_bytes

    def alloc(self, count: int) -> list[int]:
        """Take `count` pages, all or nothing (OutOfPagesError)."""
        return self.free_list.alloc(count)

    def free(self, pages: list[int]) -> None:
        self.free_list.free(pages)

    def is_free(self, page: int) -> bool:
        return self.free_list.is_free(page)

    def used_pages(self) -> list[int]:
        return self.free_list.used_pages()

    def mark_degraded(self, reason: str) -> None:
        """Take no new copies from now on (logged once, with the first reason)."""
        if not self.degraded:
            label = self.tier.label
            logger.warning(
                "%s tier degraded (%s): demotions to %s become drops", label, reason, label
            )
        self.degraded = True

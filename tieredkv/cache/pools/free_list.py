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

    Pops from the end: a fresh list hands out the lowest ids first, in contiguous runs.
    """

    def __init__(self, num_pages: int, tier_label: str) -> None:
        self.num_pages = num_pages
        self._label = tier_label
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def alloc(self, count: int) -> list[int]:
        """Take `count` pages, all or nothing."""
        if count > len(self._free):
            raise OutOfPagesError(
                f"{self._label} pool: asked for {count} pages, {len(self._free)} free"
            )
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            self._is_free[page] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for page in pages:
            assert not self._is_free[page], f"{self._label} page {page} freed twice"
            self._is_free[page] = True
            self._free.append(page)

    def take(self, pages: Iterable[int]) -> None:
        """Mark these free pages used (a disk store's live records at a warm restart); the
        rest stay free, in their order."""
        for page in pages:
            assert self._is_free[page], f"{self._label} page {page} taken while in use"
            self._is_free[page] = False
        self._free = [page for page in self._free if self._is_free[page]]

    def is_free(self, page: int) -> bool:
        return self._is_free[page]

    def used_pages(self) -> list[int]:
        return [page for page, free in enumerate(self._is_free) if not free]


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

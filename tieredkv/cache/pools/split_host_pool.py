"""The host tier in two arenas: every page's full part, and sliding parts for some pages.

A model with sliding-window layers needs a page's sliding part only within the window before a
reuse point (`sliding_pages`), so the host tier keeps full parts for all its pages and sliding
parts for a share of them (`page_parts`):

| arena   | tensor                                                      | ids                    |
|---------|-------------------------------------------------------------|------------------------|
| full    | `kv`: (num_pages, full_layers, 2, page_size, kv_heads, hd)  | the tier's page ids    |
| sliding | `sliding_kv`: (num_sliding_pages, sliding_layers, 2, ...)   | slots attached to pages |

A page has a sliding part once `attach_sliding` gave it a slot, until it is freed. The transfer
jobs reach the pages through `SplitPageRows` (`transfer.layout_copy`): a page without a
sliding part reads stale sliding rows and drops the ones written to it; its copy has that
page among its gaps (`lacking`).
"""

from __future__ import annotations

import math

import torch

from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.free_list import PageFreeList
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.prefault import Prefaulter
from tieredkv.errors import ConfigError


class SplitHostPool(HostPool):
    """A host pool whose pages hold their full part and, where attached, their sliding part.
    Engine thread only, as `HostPool`; transfer threads read `sliding_of` for pages they were
    given."""

    def __init__(
        self, parts: PageParts, num_pages: int, num_sliding_pages: int, pin_memory: bool
    ) -> None:
        if num_pages < 0 or not 0 <= num_sliding_pages <= num_pages:
            raise ConfigError(
                f"SplitHostPool: {num_sliding_pages} sliding parts for {num_pages} pages"
            )
        assert parts.has_sliding, "a split host pool is for a model with sliding layers"
        layout = parts.layout
        self.layout = layout
        self.parts = parts
        self.num_pages = num_pages
        self.num_sliding_pages = num_sliding_pages
        self.pinned = pin_memory and num_pages > 0
        self.prefaulter: Prefaulter | None = None
        self._pages_handed_out = 0
        self.kv = self._arena(num_pages, parts.part_shape(sliding=False))
        self.sliding_kv = self._arena(num_sliding_pages, parts.part_shape(sliding=True))
        self.page_bytes = parts.full_bytes
        self.free_list = PageFreeList(num_pages, self.tier.label)
        self.sliding_free = PageFreeList(num_sliding_pages, f"{self.tier.label} sliding")
        self.sliding_of: dict[int, int] = {}  # page -> its sliding part's slot

    @classmethod
    def from_bytes(
        cls, parts: PageParts, capacity_bytes: int, sliding_share: float, pin_memory: bool
    ) -> SplitHostPool:
        """As many pages as fit in `capacity_bytes` when `sliding_share` of them have a
        sliding part."""
        assert 0 < sliding_share <= 1, f"sliding_share {sliding_share}"
        page_bytes = parts.full_bytes + sliding_share * parts.sliding_bytes
        num_pages = int(capacity_bytes // page_bytes)
        num_sliding = min(num_pages, math.ceil(num_pages * sliding_share))
        while num_pages * parts.full_bytes + num_sliding * parts.sliding_bytes > capacity_bytes:
            num_pages -= 1
            num_sliding = min(num_sliding, num_pages)
        return cls(parts, num_pages, num_sliding, pin_memory)

    def _arena(self, count: int, part_shape: tuple[int, ...]) -> torch.Tensor:
        shape = (count, *part_shape)
        if self.pinned:
            return torch.zeros(shape, dtype=self.layout.dtype, pin_memory=True)
        element_bytes = torch.empty((), dtype=self.layout.dtype).element_size()
        raw = aligned_empty(count * element_bytes * math.prod(part_shape))
        return torch.from_numpy(raw).view(self.layout.dtype).view(shape)

    @property
    def capacity_bytes(self) -> int:
        return self.num_pages * self.parts.full_bytes + self.num_sliding_pages * (
            self.parts.sliding_bytes
        )

    @property
    def used_bytes(self) -> int:
        return self.num_used * self.parts.full_bytes + self.sliding_free.num_used * (
            self.parts.sliding_bytes
        )

    def attach_sliding(self, pages: list[int]) -> list[int]:
        """Give `pages` (allocated, without one) a sliding part each, in order, while slots
        are free; returns the pages given one."""
        count = min(len(pages), self.sliding_free.num_free)
        given = pages[:count]
        assert not any(page in self.sliding_of for page in given), f"{given} have sliding parts"
        self.sliding_of.update(zip(given, self.sliding_free.alloc(count), strict=True))
        return given

    def detach_sliding(self, pages: list[int]) -> None:
        """Free the sliding parts of `pages` (each has one); the pages keep their full part."""
        self.sliding_free.free([self.sliding_of.pop(page) for page in pages])

    def lacking(self, pages: list[int]) -> frozenset[int]:
        """The indexes in `pages` of the pages without a sliding part."""
        sliding_of = self.sliding_of
        return frozenset(index for index, page in enumerate(pages) if page not in sliding_of)

    def free(self, pages: list[int]) -> None:
        slots = [self.sliding_of.pop(page) for page in pages if page in self.sliding_of]
        self.sliding_free.free(slots)
        self.free_list.free(pages)

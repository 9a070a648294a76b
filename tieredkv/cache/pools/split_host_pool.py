"""The host tier for a model with sliding-window layers: pages stored a layer at a time.

A model with sliding-window layers needs a page's sliding part only within the window before a
reuse point (`sliding_pages`), so the host tier keeps every page's full part and the sliding
part only where a copy was given one (`page_parts`). Both live in one arena of layer pages (one
layer's K and V of one page): a page's full part takes `full_layers` of them, its sliding part
`sliding_layers` more, any of them, so the split between pages with and without a sliding part
follows what the pages need. Where every page keeps its sliding part (conversations within one
window) the arena holds as many pages as whole pages would; where few do (long ones) it holds
up to `(full + sliding) / full` times more:

| what         | storage                                                       |
|--------------|---------------------------------------------------------------|
| arena        | `units`: (num_units + 2, 2, page_size, kv_heads, head_dim)    |
| page table   | `table`: (num_pages, num_layers) int32, a unit per layer or -1 |

A page has a sliding part once `attach_sliding` gave it its units, until they are detached or
the page is freed. The transfer jobs reach the pages through `SplitPageRows`
(`transfer.split_rows`): a page without a sliding part reads zeros in those layers and drops
what is written there; its copy has that page among its gaps (`lacking`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.free_list import PageFreeList
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.prefault import Prefaulter
from tieredkv.errors import ConfigError


class SplitHostPool(HostPool):
    """A host pool whose pages hold their full part and, where attached, their sliding part,
    a layer page at a time from one arena. Engine thread only, as `HostPool`; transfer threads
    read the page table for pages they were given."""

    def __init__(self, parts: PageParts, num_units: int, pin_memory: bool) -> None:
        assert parts.has_sliding, "a split host pool is for a model with sliding layers"
        full, sliding = len(parts.full_layers), len(parts.sliding_layers)
        if num_units < 0:
            raise ConfigError(f"SplitHostPool: {num_units} layer pages")
        layout = parts.layout
        self.layout = layout
        self.parts = parts
        self.num_units = num_units
        # every page without its sliding part (a model whose layers all slide: a page id
        # each, its full part empty)
        self.max_pages = num_units // max(full, 1)
        self.num_sliding_pages = num_units // sliding  # the most sliding parts there is room for
        self.pinned = pin_memory and num_units > 0
        self.prefaulter: Prefaulter | None = None
        self._pages_handed_out = 0
        # two more layer pages than it hands out: one all zeros, read for a layer a page does
        # not hold, and one that writes to such a layer land in (`SplitPageRows`)
        self.units = self._arena(num_units + 2, tuple(layout.page_shape[1:]))
        self.units[num_units].zero_()
        self.zero_unit, self.discard_unit = num_units, num_units + 1
        self.unit_bytes = parts.layer_page_bytes
        self.page_bytes = parts.full_bytes
        self.table = np.full((self.max_pages, layout.num_layers), -1, dtype=np.int32)
        self._full = np.array(parts.full_layers, dtype=np.intp)
        self._sliding = np.array(parts.sliding_layers, dtype=np.intp)
        self.free_list = PageFreeList(self.max_pages, self.tier.label)
        self.unit_free = PageFreeList(num_units, f"{self.tier.label} layer pages")
        self.sliding_of: set[int] = set()  # pages with a sliding part

    @classmethod
    def from_bytes(cls, parts: PageParts, capacity_bytes: int, pin_memory: bool) -> SplitHostPool:
        """As many layer pages as fit in `capacity_bytes`."""
        return cls(parts, capacity_bytes // parts.layer_page_bytes, pin_memory)

    def _arena(self, count: int, unit_shape: tuple[int, ...]) -> torch.Tensor:
        shape = (count, *unit_shape)
        if self.pinned:
            return torch.zeros(shape, dtype=self.layout.dtype, pin_memory=True)
        element_bytes = torch.empty((), dtype=self.layout.dtype).element_size()
        raw = aligned_empty(count * element_bytes * math.prod(unit_shape))
        return torch.from_numpy(raw).view(self.layout.dtype).view(shape)

    @property
    def capacity_bytes(self) -> int:
        return self.num_units * self.unit_bytes

    @property
    def used_bytes(self) -> int:
        return self.unit_free.num_used * self.unit_bytes

    @property  # type: ignore[override]
    def num_pages(self) -> int:
        """The pages it holds and could hold now: with fewer sliding parts, more."""
        return self.free_list.num_used + self.num_free

    @property
    def num_free(self) -> int:
        """Pages that can be allocated now: page ids, and layer pages for their full parts."""
        per_page = len(self._full)
        if not per_page:
            return self.free_list.num_free
        return min(self.free_list.num_free, self.unit_free.num_free // per_page)

    @property
    def num_sliding_held(self) -> int:
        return len(self.sliding_of)

    def sliding_room(self, pages: int = 0) -> int:
        """How many sliding parts fit in the free layer pages, beside the full parts of
        `pages` pages still to be allocated."""
        free = self.unit_free.num_free - pages * len(self._full)
        return max(free, 0) // len(self._sliding)

    def alloc(self, count: int) -> list[int]:
        pages = self.free_list.alloc(count)  # OutOfPagesError when there are no ids left
        if count and len(self._full):
            try:
                units = self.unit_free.alloc(count * len(self._full))
            except BaseException:
                self.free_list.free(pages)
                raise
            rows = np.array(pages, dtype=np.intp)
            self.table[np.ix_(rows, self._full)] = np.array(units).reshape(count, -1)
        return pages

    def attach_sliding(self, pages: list[int]) -> list[int]:
        """Give `pages` (allocated, without one) a sliding part each, in order, while layer
        pages are free; returns the pages given one."""
        given = pages[: min(len(pages), self.sliding_room())]
        assert not any(page in self.sliding_of for page in given), f"{given} have sliding parts"
        if given:
            units = self.unit_free.alloc(len(given) * len(self._sliding))
            rows = np.array(given, dtype=np.intp)
            self.table[np.ix_(rows, self._sliding)] = np.array(units).reshape(len(given), -1)
            self.sliding_of.update(given)
        return given

    def detach_sliding(self, pages: list[int]) -> None:
        """Free the sliding parts of `pages` (each has one); the pages keep their full part."""
        rows = np.array(pages, dtype=np.intp)
        units = self.table[np.ix_(rows, self._sliding)]
        self.unit_free.free(units.ravel().tolist())
        self.table[np.ix_(rows, self._sliding)] = -1
        self.sliding_of.difference_update(pages)

    def lacking(self, pages: list[int]) -> frozenset[int]:
        """The indexes in `pages` of the pages without a sliding part."""
        sliding_of = self.sliding_of
        return frozenset(index for index, page in enumerate(pages) if page not in sliding_of)

    def free(self, pages: list[int]) -> None:
        with_sliding = [page for page in pages if page in self.sliding_of]
        if with_sliding:
            self.detach_sliding(with_sliding)
        rows = np.array(pages, dtype=np.intp)
        units = self.table[np.ix_(rows, self._full)]
        if units.size:
            self.unit_free.free(units.ravel().tolist())
        self.table[rows] = -1
        self.free_list.free(pages)

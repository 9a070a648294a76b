"""`LayerPages`: page ids over an arena of layer pages, the bookkeeping the split host and device
pools share.

A layer page is one layer's K and V of one page. A page's full part takes `full_layers` of them
when the page is allocated, its sliding part `sliding_layers` more where it is given one, any of
them, so the split between pages with and without a sliding part follows what the pages need:

| what         | storage                                                        |
|--------------|----------------------------------------------------------------|
| page ids     | `free_list`: up to `max_pages` (every page without a sliding part) |
| layer pages  | `unit_free`: `num_units` of them, in the pool's arena           |
| page table   | `table`: (max_pages, num_layers) int32, a layer page or -1      |
| sliding held | `sliding_of`: the pages with a sliding part                     |

Engine thread only; transfer threads read the table rows of pages they were given.
"""

from __future__ import annotations

import numpy as np

from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.free_list import PageFreeList
from tieredkv.errors import ConfigError


class LayerPages:
    """Mixed into a pool whose memory is an arena of `num_units` layer pages (plus two: one all
    zeros, `zero_unit`, read for a layer a page does not hold; one that writes to such a layer
    land in, `discard_unit`). `alloc` gives pages their full part only."""

    def _init_layer_pages(self, parts: PageParts, num_units: int, label: str) -> None:
        assert parts.has_sliding, "layer pages are for a model with sliding layers"
        if num_units < 0:
            raise ConfigError(f"{label}: {num_units} layer pages")
        self.parts = parts
        self.num_units = num_units
        full, sliding = len(parts.full_layers), len(parts.sliding_layers)
        # every page without its sliding part (a model whose layers all slide: a page id
        # each, its full part empty)
        self.max_pages = num_units // max(full, 1)
        self.num_sliding_pages = num_units // sliding  # the most sliding parts there is room for
        self.zero_unit, self.discard_unit = num_units, num_units + 1
        self.unit_bytes = parts.layer_page_bytes
        self.table = np.full((self.max_pages, parts.layout.num_layers), -1, dtype=np.int32)
        self._full = np.array(parts.full_layers, dtype=np.intp)
        self._sliding = np.array(parts.sliding_layers, dtype=np.intp)
        self.free_list = PageFreeList(self.max_pages, label)
        self.unit_free = PageFreeList(num_units, f"{label} layer pages")
        self.sliding_of: set[int] = set()  # pages with a sliding part

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
                units = self._alloc_units(count * len(self._full))
            except BaseException:
                self.free_list.free(pages)
                raise
            rows = np.array(pages, dtype=np.intp)
            self.table[np.ix_(rows, self._full)] = np.array(units).reshape(count, -1)
            self._table_changed(rows)
        return pages

    def attach_sliding(self, pages: list[int]) -> list[int]:
        """Give `pages` (allocated, without one) a sliding part each, in order, while layer
        pages are free; returns the pages given one."""
        given = pages[: min(len(pages), self.sliding_room())]
        assert not any(page in self.sliding_of for page in given), f"{given} have sliding parts"
        if given:
            units = self._alloc_units(len(given) * len(self._sliding))
            rows = np.array(given, dtype=np.intp)
            self.table[np.ix_(rows, self._sliding)] = np.array(units).reshape(len(given), -1)
            self.sliding_of.update(given)
            self._table_changed(rows)
        return given

    def detach_sliding(self, pages: list[int]) -> None:
        """Free the sliding parts of `pages` (each has one); the pages keep their full part."""
        if not pages:
            return
        rows = np.array(pages, dtype=np.intp)
        units = self.table[np.ix_(rows, self._sliding)]
        self._free_units(units.ravel().tolist())
        self.table[np.ix_(rows, self._sliding)] = -1
        self.sliding_of.difference_update(pages)
        self._table_changed(rows)

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
            self._free_units(units.ravel().tolist())
        self.table[rows] = -1
        self.free_list.free(pages)
        self._table_changed(rows)

    def _alloc_units(self, count: int) -> list[int]:
        """`count` layer pages (a store takes them in ascending order: runs move in one call)."""
        return self.unit_free.alloc(count)

    def _free_units(self, units: list[int]) -> None:
        """Give layer pages back (a store first makes their records misses)."""
        self.unit_free.free(units)

    def _table_changed(self, rows: np.ndarray) -> None:
        """Hook: the page table's `rows` changed (a pool that keeps a copy of it refreshes
        them)."""

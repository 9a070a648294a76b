"""`SplitPageRows`: the pages of a `SplitHostPool` as the page copies see any CPU pool.

The copies (`layout_copy`) move (pages, layers * 2, run) rows; a split host page keeps its
full layers' rows in one arena and its sliding layers' rows, where it has them, in another:

  read   rows of the full arena, and of the page's sliding part or zeros where it has none
  write  into the full arena, and into the page's sliding part or nowhere where it has none

so a page without a sliding part arrives (in the device pool, a staging buffer, a store) with
zeros in its sliding layers, which its copy's gaps say are not to be read.
"""

from __future__ import annotations

import numpy as np

from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.transfer.layout_copy import PageRows


class SplitPageRows(PageRows):
    """(pages, layers * 2, run) rows of a split host pool; no view spans its pages."""

    def __init__(self, pool: SplitHostPool) -> None:
        self.layer_major_layout = False
        self._full = PageRows.page_major(pool.kv)  # (pages, full layers * 2, run)
        self._sliding = PageRows.page_major(pool.sliding_kv)  # (slots, sliding layers * 2, run)
        self._sliding_of = pool.sliding_of
        parts = pool.parts
        self._full_rows = _rows_of(parts.full_layers)
        self._sliding_rows = _rows_of(parts.sliding_layers)
        full = self._full.read(0, 0)
        self._row_shape = (2 * parts.layout.num_layers, full.shape[2])
        self._dtype = full.dtype
        self._num_pages = pool.num_pages

    @property
    def num_pages(self) -> int:
        return self._num_pages

    def span(self, first: int, count: int) -> np.ndarray:
        raise AssertionError("a split host pool's pages are not one view: read and write them")

    def read(self, first: int, count: int) -> np.ndarray:
        rows = np.zeros((count, *self._row_shape), dtype=self._dtype)
        rows[:, self._full_rows] = self._full.read(first, count)
        for index in range(count):
            slot = self._sliding_of.get(first + index)
            if slot is not None:
                rows[index, self._sliding_rows] = self._sliding.read(slot, 1)[0]
        return rows

    def write(self, first: int, rows: np.ndarray) -> None:
        self._full.write(first, rows[:, self._full_rows])
        for index in range(len(rows)):
            slot = self._sliding_of.get(first + index)
            if slot is not None:
                self._sliding.write(slot, rows[index : index + 1, self._sliding_rows])

    def put(self, page: int, data: memoryview) -> None:
        rows = np.frombuffer(data, dtype=self._dtype).reshape(1, *self._row_shape)
        self.write(page, rows)


def _rows_of(layers: tuple[int, ...]) -> np.ndarray:
    """The rows (2 * layer + 0 for K, + 1 for V) of `layers`, in order."""
    return np.array([2 * layer + kv for layer in layers for kv in (0, 1)], dtype=np.intp)

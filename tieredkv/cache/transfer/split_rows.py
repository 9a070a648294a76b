"""`SplitPageRows`: the pages of a pool kept a layer at a time (`SplitHostPool`, a CPU
`SplitDevicePool`) as the page copies see any CPU pool.

The copies (`layout_copy`) move (pages, layers * 2, run) rows; a split page keeps each
layer's rows in a layer page of its own, found in the pool's page table:

  read   each layer's rows from its layer page, zeros where the page has none (its sliding
         layers, without a sliding part: the pool's zero layer page)
  write  each layer's rows into its layer page, into a discarded one where it has none

so a page without a sliding part arrives (in the device pool, a staging buffer, a store) with
zeros in its sliding layers, which its copy's gaps say are not to be read. A run of pages is
one gather (read) or one scatter (write) over the arena.
"""

from __future__ import annotations

import numpy as np
import torch

from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.transfer.layout_copy import PageRows


class SplitPageRows(PageRows):
    """(pages, layers * 2, run) rows of a split pool; no view spans its pages."""

    def __init__(self, pool: LayerPages) -> None:
        self.layer_major_layout = False
        # 2-byte elements where the dtype allows, as `PageRows`: numpy has no bfloat16
        units = pool.units  # type: ignore[attr-defined]
        assert units.device.type == "cpu", "rows of a pool in CPU memory"
        view_dtype = torch.int16 if units.element_size() % 2 == 0 else torch.uint8
        flat = units.view(view_dtype).numpy()
        self._units = flat.reshape(flat.shape[0], 2, -1)  # (layer pages, K and V, run)
        self._table = pool.table
        self._zero_unit, self._discard_unit = pool.zero_unit, pool.discard_unit
        self._layers = pool.parts.layout.num_layers
        self._run = self._units.shape[2]
        self._dtype = self._units.dtype
        self._num_pages = pool.max_pages

    @property
    def num_pages(self) -> int:
        return self._num_pages

    def span(self, first: int, count: int) -> np.ndarray:
        raise AssertionError("a split pool's pages are not one view: read and write them")

    def read(self, first: int, count: int) -> np.ndarray:
        table = self._table[first : first + count]
        units = np.where(table < 0, self._zero_unit, table).ravel()  # one gather, no mask
        rows = np.take(self._units, units, axis=0)  # (count * layers, 2, run)
        return rows.reshape(count, 2 * self._layers, self._run)

    def write(self, first: int, rows: np.ndarray) -> None:
        count = len(rows)
        table = self._table[first : first + count]
        units = np.where(table < 0, self._discard_unit, table).ravel()
        self._units[units] = rows.reshape(count * self._layers, 2, self._run)

    def put(self, page: int, data: memoryview) -> None:
        rows = np.frombuffer(data, dtype=self._dtype).reshape(1, 2 * self._layers, self._run)
        self.write(page, rows)

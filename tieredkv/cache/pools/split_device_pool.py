"""The device tier for a model with sliding-window layers: pages stored a layer at a time, so a
page's sliding part can be freed as soon as nothing reads it.

A sliding layer reads only the keys of its window (`sliding_pages`): a running sequence no
longer reads the sliding part of a page its window has passed, and a continuation of a cached
path reads it only within the window before a reuse point. The pool keeps its pages in one
arena of layer pages (`layer_pages.LayerPages`, as the split host pool): a page is allocated
whole (a sequence computes every layer of it) and its sliding part is detached once no reader
is left (`residency.sliding_reclaim`); the layer pages it frees hold other pages' layers. So the
device holds up to `(full + sliding) / full` times more long history than whole pages.

| what         | storage                                                          |
|--------------|------------------------------------------------------------------|
| arena        | `units`: (num_units + 2, 2, page_size, kv_heads, head_dim), on the device |
| page table   | `table` (numpy); `read_table`, `write_table`: its copies on the device |

Attention reads layer `l` of page `p` from layer page `table[p, l]`: `layer_table` maps a page
table through it (the zero layer page where a page has no sliding part, never read: it lies
before every window), and `store` writes through it (into the discarded layer page there).
"""

from __future__ import annotations

import numpy as np
import torch

from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.errors import ConfigError, OutOfPagesError


class SplitDevicePool(LayerPages, DevicePool):
    """A device pool of whole pages whose sliding parts may be detached. Not thread-safe, as
    `DevicePool`; the transfer threads read the table rows of pages they were given."""

    def __init__(self, parts: PageParts, num_units: int, device: torch.device | str) -> None:
        self._init_layer_pages(parts, num_units, "device")
        if self.max_pages <= 0:
            raise ConfigError(f"SplitDevicePool: {num_units} layer pages hold no page")
        layout = parts.layout
        self.layout = layout
        self.device = torch.device(device)
        self.page_bytes = layout.page_bytes  # a page as allocated: every layer
        self.layers_per_page = layout.num_layers
        self.units = torch.zeros(
            (num_units + 2, *layout.page_shape[1:]), dtype=layout.dtype, device=self.device
        )
        self.stamps = np.zeros(self.max_pages, dtype=np.int64)
        self._next_stamp = 1
        self.sliding_layers = parts.sliding_layers
        # the page table where attention reads it, missing layer pages as the zero one, and
        # where new K/V are written through it, missing ones as the discarded one
        self.read_table = torch.full_like(torch.from_numpy(self.table), self.zero_unit)
        self.read_table = self.read_table.to(self.device)
        self.write_table = torch.full_like(self.read_table, self.discard_unit)
        self._version = 0  # of the tables: a change makes the step's store rows stale
        self._rows_cache: tuple | None = None

    @classmethod
    def from_bytes(  # type: ignore[override]
        cls, parts: PageParts, capacity_bytes: int, device: torch.device | str
    ) -> SplitDevicePool:
        """As many layer pages as fit in `capacity_bytes`."""
        return cls(parts, capacity_bytes // parts.layer_page_bytes, device)

    @property  # type: ignore[override]
    def num_free(self) -> int:
        """Whole pages that can be allocated now: page ids, and layer pages for every layer."""
        return min(self.free_list.num_free, self.unit_free.num_free // self.layers_per_page)

    def alloc(self, count: int) -> list[int]:
        """`count` whole pages (every layer), all or nothing (OutOfPagesError)."""
        if count > self.num_free:
            raise OutOfPagesError(f"device pool: asked for {count} pages, {self.num_free} free")
        pages = LayerPages.alloc(self, count)
        given = self.attach_sliding(pages)
        assert len(given) == len(pages), f"{len(given)} of {count} pages got a sliding part"
        self.restamp(pages)
        return pages

    def fill_sliding(self, sources: list[int], targets: list[int]) -> bool:
        if len(targets) > self.sliding_room():
            return False
        self.attach_sliding(targets)
        columns = self._sliding
        into = self.table[np.ix_(np.array(targets, dtype=np.intp), columns)].ravel()
        from_units = self.table[np.ix_(np.array(sources, dtype=np.intp), columns)].ravel()
        self._copy_units(from_units, into)
        self.restamp(targets)
        return True

    def held_page_equivalents(self, pages: list[int]) -> int:
        """What `pages` take, in whole pages (rounded up): pages without a sliding part take
        their full layers' share."""
        layers, sliding = self.layers_per_page, len(self._sliding)
        without = sum(1 for page in pages if page not in self.sliding_of)
        return -(-(len(pages) * layers - without * sliding) // layers)

    def _table_changed(self, rows: np.ndarray) -> None:
        if not hasattr(self, "read_table"):
            return  # still being built: the tables start as they are
        table = torch.from_numpy(self.table[rows]).to(self.device)
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        missing = table < 0
        self._version += 1
        self.read_table[index] = torch.where(missing, self.zero_unit, table)
        self.write_table[index] = torch.where(missing, self.discard_unit, table)

    # --- the pages as attention and the workspaces read and write them ----------------------

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.units[:, 0], self.units[:, 1]

    def layer_table(self, layer: int, page_table: torch.Tensor) -> torch.Tensor:
        return self.read_table[:, layer][page_table.long()].to(page_table.dtype)

    def store(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        k_rows, v_rows = self._store_rows(slot_mapping)
        rows = self.units.view(-1, k.shape[1], k.shape[2])  # (units * 2 * page_size, ...)
        rows.index_copy_(0, k_rows[layer], k)
        rows.index_copy_(0, v_rows[layer], v)

    def _store_rows(self, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The arena rows (layers, T) the K and V of slots `slot_mapping` go to: computed for
        every layer once a step (the step's layers share its slot mapping, and the table does
        not change within a step)."""
        cached = self._rows_cache
        if cached is not None and cached[0] is slot_mapping and cached[1] == self._version:
            return cached[2], cached[3]
        page_size = self.layout.page_size
        units = self.write_table[slot_mapping // page_size].long().T  # (layers, T)
        k_rows = units * (2 * page_size) + slot_mapping % page_size
        v_rows = k_rows + page_size
        # holding the mapping keeps its id from being reused by a later step's
        self._rows_cache = (slot_mapping, self._version, k_rows, v_rows)
        return k_rows, v_rows

    def layer_run(self, layers: slice, first: int, count: int) -> torch.Tensor:
        index = self.read_table[first : first + count, layers].T.long()  # (layers, count)
        run = self.units[index.reshape(-1)]  # (layers * count, 2, page_size, ...)
        return run.view(index.shape[0], count, *run.shape[1:]).transpose(1, 2)

    def copy_pages(self, sources: list[int], targets: list[int]) -> None:
        """Copy whole pages: `targets[i]` becomes a copy of `sources[i]` (each target has all
        its layers; a source without its sliding part gives zeros there)."""
        if not sources:
            return
        table = self.table
        from_units = np.where(table[sources] < 0, self.zero_unit, table[sources]).ravel()
        into_units = table[targets].ravel()
        assert (into_units >= 0).all(), f"copy into pages {targets} without every layer"
        self._copy_units(from_units, into_units)

    def _copy_units(self, sources: np.ndarray, targets: np.ndarray) -> None:
        """Layer page `targets[i]` becomes a copy of layer page `sources[i]`."""
        into = torch.from_numpy(targets.astype(np.int64)).to(self.device)
        from_index = torch.from_numpy(sources.astype(np.int64)).to(self.device)
        self.units.index_copy_(0, into, self.units.index_select(0, from_index))

    def gather_pages(self, pages: list[int], out: torch.Tensor) -> torch.Tensor:
        """Pages `pages` into `out`, (n, layers, 2, page_size, kv_heads, head_dim) on the device,
        zeros where a page has no sliding part."""
        rows = np.where(self.table[pages] < 0, self.zero_unit, self.table[pages]).ravel()
        index = torch.from_numpy(rows.astype(np.int64)).to(self.device)
        torch.index_select(self.units, 0, index, out=out.view(-1, *self.units.shape[1:]))
        return out

    def scatter_pages(self, pages: list[int], staging: torch.Tensor) -> None:
        """`staging` (n, layers, 2, page_size, kv_heads, head_dim, on the device) into pages
        `pages`, what falls in a missing sliding part dropped."""
        rows = np.where(self.table[pages] < 0, self.discard_unit, self.table[pages]).ravel()
        index = torch.from_numpy(rows.astype(np.int64)).to(self.device)
        self.units.index_copy_(0, index, staging.reshape(-1, *self.units.shape[1:]))

    def read_page(self, page: int) -> torch.Tensor:
        return self.units[self.read_table[page].long()].clone()

    def write_page(self, page: int, contents: torch.Tensor) -> None:
        self.units[self.write_table[page].long()] = contents.to(self.units.dtype)

"""The host tier for a model with sliding-window layers: pages stored a layer at a time.

A model with sliding-window layers needs a page's sliding part only within the window before a
reuse point (`sliding_pages`), so the host tier keeps every page's full part and the sliding
part only where a copy was given one (`page_parts`). Both live in one arena of layer pages (one
layer's K and V of one page): a page's full part takes `full_layers` of them, its sliding part
`sliding_layers` more, any of them, so the split between pages with and without a sliding part
follows what the pages need (`layer_pages`). Where every page keeps its sliding part
(conversations within one window) the arena holds as many pages as whole pages would; where few
do (long ones) it holds up to `(full + sliding) / full` times more. The arena is `units`:
(num_units + 2, 2, page_size, kv_heads, head_dim).

A page has a sliding part once `attach_sliding` gave it its units, until they are detached or
the page is freed. The transfer jobs reach the pages through `SplitPageRows`
(`transfer.split_rows`): a page without a sliding part reads zeros in those layers and drops
what is written there; its copy has that page among its gaps (`lacking`).
"""

from __future__ import annotations

import math

import torch

from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.pools.prefault import Prefaulter


class SplitHostPool(LayerPages, HostPool):
    """A host pool whose pages hold their full part and, where attached, their sliding part,
    a layer page at a time from one arena (`LayerPages`). Engine thread only, as `HostPool`;
    transfer threads read the page table for pages they were given."""

    def __init__(self, parts: PageParts, num_units: int, pin_memory: bool) -> None:
        self._init_layer_pages(parts, num_units, self.tier.label)
        layout = parts.layout
        self.layout = layout
        self.pinned = pin_memory and num_units > 0
        self.prefaulter: Prefaulter | None = None
        self._pages_handed_out = 0
        self.units = self._arena(num_units + 2, tuple(layout.page_shape[1:]))
        self.units[num_units].zero_()
        self.page_bytes = parts.full_bytes

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

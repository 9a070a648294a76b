"""The device tier's memory: one layer-major KV tensor and its free list (a PagePool).

Layout `[num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]` (2 = K, V) lets attention
read a layer's pages in place. On a CPU-only machine the tensor lives in RAM; the tier semantics
are the same.
"""

from __future__ import annotations

import numpy as np
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.free_list import PageFreeList, PagePool
from tieredkv.cache.tier import Tier
from tieredkv.errors import ConfigError


class DevicePool(PagePool):
    """Owns the device KV tensor and a LIFO free list of page ids.

    Not thread-safe: only the engine thread allocates and frees.

    `stamps[page]` is a number unique to the allocation that holds the page now (0: never
    allocated). A page's KV is written only by the allocation that holds it, so a copy of a page
    taken while it was held is still the page's content while its stamp is unchanged (the CPU
    attention's workspaces reuse what they copied; see tieredkv.model.workspace).
    """

    tier = Tier.DEVICE

    def __init__(self, layout: PageLayout, num_pages: int, device: torch.device | str) -> None:
        if num_pages <= 0:
            raise ConfigError(f"DevicePool num_pages must be > 0, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        # (layers, 2, num_pages, page_size, kv_heads, head_dim)
        self.kv = torch.zeros(
            (
                layout.num_layers,
                2,
                num_pages,
                layout.page_size,
                layout.num_kv_heads,
                layout.head_dim,
            ),
            dtype=layout.dtype,
            device=self.device,
        )
        self.page_bytes = layout.page_bytes
        self.free_list = PageFreeList(num_pages, self.tier.label)
        self.stamps = np.zeros(num_pages, dtype=np.int64)
        self._next_stamp = 1

    @classmethod
    def from_bytes(
        cls, layout: PageLayout, capacity_bytes: int, device: torch.device | str
    ) -> DevicePool:
        return cls(layout, capacity_bytes // layout.page_bytes, device)

    def alloc(self, count: int) -> list[int]:
        pages = super().alloc(count)
        if pages:
            first = self._next_stamp
            self.stamps[pages] = np.arange(first, first + len(pages))
            self._next_stamp = first + len(pages)
        return pages

    def copy_pages(self, sources: list[int], targets: list[int]) -> None:
        """Copy whole pages, every layer, K and V: `targets[i]` becomes a copy of `sources[i]`
        (a fork's partial last page of the prompt)."""
        if not sources:
            return
        index = torch.tensor(sources, dtype=torch.int64, device=self.device)
        into = torch.tensor(targets, dtype=torch.int64, device=self.device)
        self.kv.index_copy_(2, into, self.kv.index_select(2, index))

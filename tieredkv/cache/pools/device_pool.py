"""The device tier's memory: one layer-major KV tensor and its free list (a PagePool).

Layout `[num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]` (2 = K, V) lets attention
read a layer's pages in place. On a CPU-only machine the tensor lives in RAM; the tier semantics
are the same. Attention and the workspaces reach the pages through `layer_kv`, `layer_table`,
`store` and `layer_run`, which a pool that keeps its pages a layer at a time
(`split_device_pool`) answers through its page table.
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

    def __init__(
        self,
        layout: PageLayout,
        num_pages: int,
        device: torch.device | str,
        sliding_layers: tuple[int, ...] = (),
    ) -> None:
        """`sliding_layers`: the model's sliding-window layers (`fill_sliding` copies them)."""
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
        self.sliding_layers = sliding_layers
        self.free_list = PageFreeList(num_pages, self.tier.label)
        self.stamps = np.zeros(num_pages, dtype=np.int64)
        self._next_stamp = 1

    @classmethod
    def from_bytes(
        cls,
        layout: PageLayout,
        capacity_bytes: int,
        device: torch.device | str,
        sliding_layers: tuple[int, ...] = (),
    ) -> DevicePool:
        return cls(layout, capacity_bytes // layout.page_bytes, device, sliding_layers)

    def alloc(self, count: int) -> list[int]:
        pages = super().alloc(count)
        self.restamp(pages)
        return pages

    def restamp(self, pages: list[int]) -> None:
        """Give `pages` new stamps: what a workspace copied of them is not their content now."""
        if pages:
            first = self._next_stamp
            self.stamps[pages] = np.arange(first, first + len(pages))
            self._next_stamp = first + len(pages)

    def fill_sliding(self, sources: list[int], targets: list[int]) -> bool:
        """Give `targets` (pages whose sliding layers hold nothing to read) the sliding layers
        of `sources`, under new stamps; their full layers stay as they are. False (nothing
        done) where there is no room for them."""
        if targets:
            into = torch.tensor(targets, device=self.device)
            from_pages = torch.tensor(sources, device=self.device)
            for layer in self.sliding_layers:
                pages = self.kv[layer]  # (2, pages, page_size, kv_heads, head_dim), a view
                pages.index_copy_(1, into, pages.index_select(1, from_pages))
        self.restamp(targets)
        return True

    def copy_pages(self, sources: list[int], targets: list[int]) -> None:
        """Copy whole pages, every layer, K and V: `targets[i]` becomes a copy of `sources[i]`
        (a fork's partial last page of the prompt)."""
        if not sources:
            return
        index = torch.tensor(sources, dtype=torch.int64, device=self.device)
        into = torch.tensor(targets, dtype=torch.int64, device=self.device)
        self.kv.index_copy_(2, into, self.kv.index_select(2, index))

    # --- the pages as attention and the workspaces read and write them ----------------------

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V pages, (pages, page_size, kv_heads, head_dim) each, indexed by
        `layer_table`'s entries."""
        return self.kv[layer, 0], self.kv[layer, 1]

    def layer_table(self, layer: int, page_table: torch.Tensor) -> torch.Tensor:
        """`page_table` (sequences, pages) of page ids as `layer_kv(layer)`'s page indexes."""
        return page_table

    def store(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write new tokens' K/V (T, kv_heads, head_dim) of `layer` into their slots
        (page * page_size + offset)."""
        kv_heads, head_dim = k.shape[1], k.shape[2]
        self.kv[layer, 0].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
        self.kv[layer, 1].view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)

    def layer_run(self, layers: slice, first: int, count: int) -> torch.Tensor:
        """Pages `first`..`first + count - 1` of `layers`: (layers, 2, count, page_size,
        kv_heads, head_dim), a view here."""
        return self.kv[layers, :, first : first + count]

    def read_page(self, page: int) -> torch.Tensor:
        """A copy of page `page`'s KV, (layers, 2, page_size, kv_heads, head_dim)."""
        return self.kv[:, :, page].clone()

    def write_page(self, page: int, contents: torch.Tensor) -> None:
        """Set page `page`'s KV, (layers, 2, page_size, kv_heads, head_dim)."""
        self.kv[:, :, page] = contents

"""The device tier's memory: one layer-major KV tensor and its free list (a PagePool).

Layout `[num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]` (2 = K, V) lets attention
read a layer's pages in place. On a CPU-only machine the tensor lives in RAM; the tier semantics
are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tieredkv.cache.free_list import PageFreeList, PagePool
from tieredkv.config import ModelConfig
from tieredkv.errors import ConfigError


@dataclass(frozen=True)
class PageLayout:
    """The shape of one page of KV (all layers), shared by every tier."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @classmethod
    def for_model(cls, model: ModelConfig, page_size: int, dtype: torch.dtype) -> PageLayout:
        return cls(model.num_layers, model.num_kv_heads, model.head_dim, page_size, dtype)

    @property
    def token_bytes(self) -> int:
        """KV bytes of one token across all layers."""
        element_bytes = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * element_bytes

    @property
    def page_bytes(self) -> int:
        return self.token_bytes * self.page_size

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one page in the page-major (host/disk/staging) layout."""
        return (self.num_layers, 2, self.page_size, self.num_kv_heads, self.head_dim)

    def describe(self) -> str:
        """A stable text form, part of the model fingerprint."""
        return (
            f"layers={self.num_layers},kv_heads={self.num_kv_heads},head_dim={self.head_dim},"
            f"page_size={self.page_size},dtype={str(self.dtype).removeprefix('torch.')},"
            "device=layer-major,host=page-major"
        )


class DevicePool(PagePool):
    """Owns the device KV tensor and a LIFO free list of page ids.

    Not thread-safe: only the engine thread allocates and frees.
    """

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
        self.free_list = PageFreeList(num_pages, "device")

    @classmethod
    def from_bytes(
        cls, layout: PageLayout, capacity_bytes: int, device: torch.device | str
    ) -> DevicePool:
        return cls(layout, capacity_bytes // layout.page_bytes, device)

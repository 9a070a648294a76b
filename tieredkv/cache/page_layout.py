"""The shape of a KV page, shared by every tier, and page-aligned host buffers for pages."""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import torch

from tieredkv.model_config import ModelConfig


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


def aligned_empty(num_bytes: int) -> np.ndarray:
    """A page-aligned (hence O_DIRECT-aligned) uint8 buffer: an anonymous mmap. Give the disk
    store tensors built on these (torch.from_numpy(...).view(dtype)) to skip its bounce copy."""
    region = mmap.mmap(-1, max(num_bytes, 1))
    return np.frombuffer(region, dtype=np.uint8, count=num_bytes)

"""Pure-torch reference kernels: the specification every other backend is tested against.

Layouts:
  device pool  kv_pool  (num_layers, 2, num_pages, page_size, kv_heads, head_dim)  layer-major
  staging      staging  (num_pages_moved, num_layers, 2, page_size, kv_heads, head_dim)  page-major
"""

from __future__ import annotations

import torch


def gather_pages(
    kv_pool: torch.Tensor, page_ids: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Copy pages `page_ids` of the layer-major pool into a page-major staging buffer."""
    # (layers, 2, n, page_size, kv_heads, head_dim) -> (n, layers, 2, page_size, kv_heads, head_dim)
    pages = kv_pool.index_select(2, page_ids.to(kv_pool.device)).permute(2, 0, 1, 3, 4, 5)
    if out is None:
        return pages.contiguous()
    out.copy_(pages)
    return out


def scatter_pages(kv_pool: torch.Tensor, page_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """Copy a page-major staging buffer into pages `page_ids` of the layer-major pool."""
    # staging (n, layers, 2, page_size, kv_heads, head_dim) -> (layers, 2, n, ...)
    kv_pool.index_copy_(2, page_ids.to(kv_pool.device), staging.permute(1, 2, 0, 3, 4, 5))

"""Triton page gather/scatter between the layer-major pool and a page-major staging buffer.

Same contract as `reference.gather_pages` / `reference.scatter_pages`. One page of one layer's K
or V is a contiguous run of page_size * kv_heads * head_dim elements in both layouts, so a
program copies BLOCK elements of one such run:

  program (i, layer * 2 + kv, block)
    pool     kv_pool[layer, kv, page_ids[i]]    (page_size, kv_heads, head_dim) run
    staging  staging[i, layer, kv]              same run
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_page_copy_args
from .triton_support import check_device

_BLOCK = 1024  # elements per program: 2 KiB of bf16, enough loads in flight per program


@triton.jit
def _copy_pages_kernel(
    pool_ptr, staging_ptr, page_ids_ptr,
    stride_pool_layer, stride_pool_kv, stride_pool_page,
    stride_stage_page, stride_stage_layer, stride_stage_kv,
    RUN: tl.constexpr, BLOCK: tl.constexpr, TO_STAGING: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    layer = (tl.program_id(1) // 2).to(tl.int64)
    kv = (tl.program_id(1) % 2).to(tl.int64)
    page = tl.load(page_ids_ptr + i).to(tl.int64)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    in_run = offs < RUN
    pool = pool_ptr + layer * stride_pool_layer + kv * stride_pool_kv + page * stride_pool_page
    stage = staging_ptr + i * stride_stage_page + layer * stride_stage_layer + kv * stride_stage_kv
    if TO_STAGING:
        tl.store(stage + offs, tl.load(pool + offs, mask=in_run), mask=in_run)
    else:
        tl.store(pool + offs, tl.load(stage + offs, mask=in_run), mask=in_run)


def _launch(kv_pool: torch.Tensor, page_ids: torch.Tensor, staging: torch.Tensor, to_staging: bool):
    num_layers, _, _, page_size, kv_heads, head_dim = kv_pool.shape
    run = page_size * kv_heads * head_dim
    block = min(_BLOCK, triton.next_power_of_2(run))
    grid = (page_ids.shape[0], num_layers * 2, triton.cdiv(run, block))
    _copy_pages_kernel[grid](
        kv_pool, staging, page_ids,
        kv_pool.stride(0), kv_pool.stride(1), kv_pool.stride(2),
        staging.stride(0), staging.stride(1), staging.stride(2),
        RUN=run, BLOCK=block, TO_STAGING=to_staging,
    )  # fmt: skip


def _device_page_ids(kv_pool: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """page_ids on the pool's device, contiguous (a host tensor is copied over)."""
    return page_ids.to(kv_pool.device, non_blocking=True).contiguous()


def gather_pages(
    kv_pool: torch.Tensor, page_ids: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton version of `reference.gather_pages` (same arguments and result).

    Page ids are not range-checked (that would sync the device): each must be < num_pages.
    """
    check_page_copy_args(kv_pool, page_ids, out, staging_name="out")
    check_device("kv_pool", kv_pool)
    if out is None:
        num_layers, _, _, page_size, kv_heads, head_dim = kv_pool.shape
        shape = (page_ids.shape[0], num_layers, 2, page_size, kv_heads, head_dim)
        out = torch.empty(shape, dtype=kv_pool.dtype, device=kv_pool.device)
    if page_ids.shape[0] > 0 and kv_pool.numel() > 0:
        _launch(kv_pool, _device_page_ids(kv_pool, page_ids), out, to_staging=True)
    return out


def scatter_pages(kv_pool: torch.Tensor, page_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """Triton version of `reference.scatter_pages` (same arguments and effect).

    Page ids must be distinct and < num_pages; neither is checked (that would sync the device).
    """
    check_page_copy_args(kv_pool, page_ids, staging)
    check_device("kv_pool", kv_pool)
    if page_ids.shape[0] > 0 and kv_pool.numel() > 0:
        _launch(kv_pool, _device_page_ids(kv_pool, page_ids), staging, to_staging=False)

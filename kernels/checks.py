"""Argument checks shared by every kernel backend.

Each check raises a ValueError that names the offending argument and what was expected, so a
caller's mistake surfaces at the wrapper instead of as a wrong answer or a memory fault inside a
kernel. Only metadata is checked (shapes, strides, dtypes, devices): reading values would force a
device sync on every call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class AttentionDims:
    """The sizes of one paged attention call, read from its arguments' shapes."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    max_pages_per_seq: int

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


def _fail(name: str, tensor: torch.Tensor, expected: str) -> ValueError:
    return ValueError(
        f"{name}: expected {expected}, got shape {tuple(tensor.shape)} dtype {tensor.dtype} "
        f"strides {tuple(tensor.stride())} on {tensor.device}"
    )


def _check_index(
    name: str, tensor: torch.Tensor, shape: tuple[int, ...] | None, device: torch.device
) -> None:
    if shape is not None and tuple(tensor.shape) != shape:
        raise _fail(name, tensor, f"shape {shape}")
    if tensor.dtype not in _INDEX_DTYPES:
        raise _fail(name, tensor, "dtype int32 or int64")
    if tensor.device != device:
        raise _fail(name, tensor, f"device {device} (the device of q)")
    if tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise _fail(name, tensor, "a contiguous last dimension (stride 1)")


def check_attention_args(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    query_start: torch.Tensor | None,
    kv_lens: torch.Tensor,
) -> AttentionDims:
    """Check a paged attention call; `query_start` is None for decode (one query per sequence).

    q (num_tokens, num_heads, head_dim) for prefill, (batch, num_heads, head_dim) for decode;
    k_pages, v_pages (num_pages, page_size, num_kv_heads, head_dim), same dtype as q; page_table
    (batch, max_pages_per_seq); query_start (batch + 1,); kv_lens (batch,). The last dimension of
    q, k_pages and v_pages must be contiguous (stride 1); other strides are free.
    """
    if q.dim() != 3 or q.dtype not in _FLOAT_DTYPES or q.stride(-1) != 1:
        raise _fail("q", q, "3-d (tokens, num_heads, head_dim) float16/bfloat16/float32, stride 1")
    _, num_heads, head_dim = q.shape
    if k_pages.dim() != 4 or k_pages.shape[-1] != head_dim or k_pages.stride(-1) != 1:
        raise _fail("k_pages", k_pages, f"(num_pages, page_size, kv_heads, {head_dim}), stride 1")
    if k_pages.dtype != q.dtype or k_pages.device != q.device:
        raise _fail("k_pages", k_pages, f"dtype {q.dtype} on {q.device} (those of q)")
    if v_pages.shape != k_pages.shape or v_pages.stride(-1) != 1:
        raise _fail("v_pages", v_pages, f"shape {tuple(k_pages.shape)} (that of k_pages), stride 1")
    if v_pages.dtype != q.dtype or v_pages.device != q.device:
        raise _fail("v_pages", v_pages, f"dtype {q.dtype} on {q.device} (those of q)")
    num_kv_heads = k_pages.shape[2]
    if num_heads % num_kv_heads:
        raise _fail("q", q, f"num_heads a multiple of num_kv_heads ({num_kv_heads})")
    if page_table.dim() != 2:
        raise _fail("page_table", page_table, "2-d (batch, max_pages_per_seq)")
    batch = page_table.shape[0]
    _check_index("page_table", page_table, None, q.device)
    _check_index("kv_lens", kv_lens, (batch,), q.device)
    if query_start is None:
        if q.shape[0] != batch:
            raise _fail("q", q, f"one token per sequence: shape[0] == batch ({batch})")
    else:
        _check_index("query_start", query_start, (batch + 1,), q.device)
    return AttentionDims(
        batch=batch,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=k_pages.shape[1],
        max_pages_per_seq=page_table.shape[1],
    )


def check_window(window: int | None) -> None:
    """A sliding window is a positive number of tokens, or None (full attention)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window: must be a positive number of tokens or None, got {window!r}")


def check_page_copy_args(
    kv_pool: torch.Tensor,
    page_ids: torch.Tensor,
    staging: torch.Tensor | None,
    staging_name: str = "staging",
) -> None:
    """Check a gather/scatter between the pool and a staging buffer.

    kv_pool (num_layers, 2, num_pages, page_size, kv_heads, head_dim); page_ids (n,) int32/int64
    on any device; staging (n, num_layers, 2, page_size, kv_heads, head_dim) with the pool's
    dtype and device (None: gather allocates it). Each (page_size, kv_heads, head_dim) run must be
    contiguous in both tensors, so one page of one layer moves as one block.
    """
    if kv_pool.dim() != 6 or kv_pool.shape[1] != 2:
        raise _fail("kv_pool", kv_pool, "(num_layers, 2, num_pages, page_size, kv_heads, head_dim)")
    if not _inner_contiguous(kv_pool):
        raise _fail("kv_pool", kv_pool, "contiguous (page_size, kv_heads, head_dim) runs")
    if page_ids.dim() != 1 or page_ids.dtype not in _INDEX_DTYPES:
        raise _fail("page_ids", page_ids, "1-d int32 or int64")
    if staging is None:
        return
    num_layers, _, _, page_size, kv_heads, head_dim = kv_pool.shape
    shape = (page_ids.shape[0], num_layers, 2, page_size, kv_heads, head_dim)
    if tuple(staging.shape) != shape:
        raise _fail(staging_name, staging, f"shape {shape}")
    if staging.dtype != kv_pool.dtype or staging.device != kv_pool.device:
        raise _fail(staging_name, staging, f"dtype {kv_pool.dtype} on {kv_pool.device} (pool's)")
    if not _inner_contiguous(staging):
        raise _fail(staging_name, staging, "contiguous (page_size, kv_heads, head_dim) runs")


def _inner_contiguous(tensor: torch.Tensor) -> bool:
    """Whether the last three dimensions form one dense run of memory (size-1 dims ignored)."""
    expected = 1
    inner = zip(reversed(tensor.shape[-3:]), reversed(tensor.stride()[-3:]), strict=True)
    for size, stride in inner:
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True

"""Pure-torch reference kernels: the specification every other backend is tested against.

Layouts:
  device pool  kv_pool  (num_layers, 2, num_pages, page_size, kv_heads, head_dim)  layer-major
  staging      staging  (num_pages_moved, num_layers, 2, page_size, kv_heads, head_dim)  page-major
  one layer    k_pages = kv_pool[layer, 0], v_pages = kv_pool[layer, 1]
               (num_pages, page_size, kv_heads, head_dim)

Attention positions (sequence i, q_len new tokens, kv_len tokens in its pages, prefix included):

  key positions      0 .......................... kv_len - 1
  query j sits at              kv_len - q_len + j   (0 <= j < q_len)
  query j attends    0 ...... kv_len - q_len + j    (causal, aligned bottom-right)
  with a window W    p - W + 1 .. p, p = kv_len - q_len + j  (a sliding-window layer)

The new tokens' K/V are already in the pages when attention runs. Query head h reads kv head
h // (num_heads // num_kv_heads) (GQA). Scores and softmax are fp32; the output has q's dtype.
This module gathers each sequence's pages on every call: it is the specification, not a fast path.
"""

from __future__ import annotations

import torch

from .checks import check_attention_args, check_page_copy_args, check_window


def gather_pages(
    kv_pool: torch.Tensor, page_ids: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Copy pages `page_ids` of the layer-major pool into a page-major staging buffer.

    Returns `out` (filled) or a new contiguous (n, layers, 2, page_size, kv_heads, head_dim)
    tensor. `page_ids` may live on any device.
    """
    check_page_copy_args(kv_pool, page_ids, out, staging_name="out")
    if kv_pool.device.type == "cpu":
        # one strided copy per page, straight into the staging (index_select and permute cost
        # two copies through fresh memory: several times slower)
        pages = _cpu_page_list(kv_pool, page_ids)
        if out is None:
            out = torch.empty(
                (len(pages), *kv_pool.shape[:2], *kv_pool.shape[3:]), dtype=kv_pool.dtype
            )
        for row, page in enumerate(pages):
            out[row].copy_(kv_pool[:, :, page])  # (layers, 2, page_size, kv_heads, head_dim)
        return out
    # (layers, 2, n, page_size, kv_heads, head_dim) -> (n, layers, 2, page_size, kv_heads, head_dim)
    pages = kv_pool.index_select(2, page_ids.to(kv_pool.device)).permute(2, 0, 1, 3, 4, 5)
    if out is None:
        return pages.contiguous()
    out.copy_(pages)
    return out


def scatter_pages(kv_pool: torch.Tensor, page_ids: torch.Tensor, staging: torch.Tensor) -> None:
    """Copy a page-major staging buffer into pages `page_ids` of the layer-major pool.

    `page_ids` must be distinct (two rows written to one page leave either one there).
    """
    check_page_copy_args(kv_pool, page_ids, staging)
    if kv_pool.device.type == "cpu":  # one strided copy per page, no temporary
        for row, page in enumerate(_cpu_page_list(kv_pool, page_ids)):
            kv_pool[:, :, page].copy_(staging[row])
        return
    # staging (n, layers, 2, page_size, kv_heads, head_dim) -> (layers, 2, n, ...)
    kv_pool.index_copy_(2, page_ids.to(kv_pool.device), staging.permute(1, 2, 0, 3, 4, 5))


def _cpu_page_list(kv_pool: torch.Tensor, page_ids: torch.Tensor) -> list[int]:
    """page_ids as ints, each checked in range (as index_select would)."""
    pages = page_ids.tolist()
    num_pages = kv_pool.shape[2]
    if pages and not 0 <= min(pages) <= max(pages) < num_pages:
        raise IndexError(f"page_ids: out of range for a pool of {num_pages} pages: {pages}")
    return pages


def paged_prefill_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    query_start: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged KV (prefix + new).

    q (num_tokens, num_heads, head_dim): the new tokens of all sequences, concatenated;
    k_pages, v_pages (num_pages, page_size, num_kv_heads, head_dim): one layer of the pool;
    page_table (batch, max_pages_per_seq): row i lists sequence i's pages in order (the tail past
    its last page is ignored); query_start (batch + 1,): cumulative offsets into q;
    kv_lens (batch,): tokens of sequence i in the pages, prefix + new (>= its q_len);
    window: a sliding window of W tokens (the query at p sees keys p - W < j <= p), None: all.
    Returns (num_tokens, num_heads, head_dim) in q's dtype.
    """
    dims = check_attention_args(q, k_pages, v_pages, page_table, query_start, kv_lens)
    check_window(window)
    starts = query_start.tolist()
    lens = kv_lens.tolist()
    if starts[0] != 0 or starts[-1] != q.shape[0]:
        raise ValueError(f"query_start: must run from 0 to num_tokens ({q.shape[0]}), got {starts}")
    out = torch.empty_like(q)
    for i, kv_len in enumerate(lens):
        q_len = starts[i + 1] - starts[i]
        if not 0 <= q_len <= kv_len <= dims.max_pages_per_seq * dims.page_size:
            raise ValueError(
                f"sequence {i}: need 0 <= q_len ({q_len}) <= kv_lens[{i}] ({kv_len}) <= "
                f"max_pages_per_seq * page_size ({dims.max_pages_per_seq * dims.page_size})"
            )
        if q_len == 0:
            continue
        keys, values = _sequence_kv(k_pages, v_pages, page_table[i], kv_len)
        out[starts[i] : starts[i + 1]] = _attend(
            q[starts[i] : starts[i + 1]], keys, values, scale, window
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its whole paged KV (kv_lens[i] >= 1 tokens,
    the new token's K/V included): prefill with q_len = 1 for every sequence.

    q (batch, num_heads, head_dim) -> (batch, num_heads, head_dim) in q's dtype.
    """
    check_attention_args(q, k_pages, v_pages, page_table, None, kv_lens)
    query_start = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention(
        q, k_pages, v_pages, page_table, query_start, kv_lens, scale, window
    )


def _sequence_kv(
    k_pages: torch.Tensor, v_pages: torch.Tensor, pages_row: torch.Tensor, kv_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first kv_len keys and values, gathered from its pages in order."""
    page_size, num_kv_heads, head_dim = k_pages.shape[1:]
    pages = pages_row[: -(-kv_len // page_size)].long()
    # (n_pages, page_size, kv_heads, head_dim) -> (kv_len, kv_heads, head_dim)
    keys = k_pages[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len]
    values = v_pages[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len]
    return keys, values


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Bottom-right-aligned causal GQA attention of q_len queries over kv_len >= q_len keys,
    each query seeing the last `window` keys up to itself (None: all of them)."""
    q_len, num_heads, head_dim = q.shape
    kv_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    # a window's keys before the first query's first one are never read (they may be gone)
    first = 0 if window is None else max(0, kv_len - q_len - window + 1)
    keys, values = keys[first:], values[first:]
    # Query heads h = kv * group + g share kv head kv: view them as (kv_heads, group).
    qg = q.float().reshape(q_len, num_kv_heads, group, head_dim)
    scores = torch.einsum("qkgd,skd->kgqs", qg, keys.float()) * scale  # (kvh, group, q_len, keys)
    query_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)  # (q_len,)
    key_pos = torch.arange(first, kv_len, device=q.device)  # (kv_len - first,)
    allowed = key_pos[None, :] <= query_pos[:, None]  # (q_len, kv_len - first)
    if window is not None:
        allowed &= key_pos[None, :] > query_pos[:, None] - window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    out = torch.einsum("kgqs,skd->qkgd", probs, values.float())  # (q_len, kvh, group, head_dim)
    return out.reshape(q_len, num_heads, head_dim).to(q.dtype)

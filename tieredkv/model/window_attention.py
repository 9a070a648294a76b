"""Attention of a sliding-window layer over one sequence's contiguous KV (the CPU path).

A sliding layer's query at position p sees keys p - W < j <= p (transformers' `sliding_window`
W). Queries go in blocks of `BLOCK_QUERIES`; a block reads only the keys its queries can see,
from its first query's window start to its last query, and masks the band inside them:

  block rows         positions lo .. hi - 1 (after `offset` = kv_len - n earlier tokens)
  keys it reads      first = max(0, lo - W + 1) .. hi - 1
  row p sees key j   p - W < j <= p

so neither the scores nor the reads grow with the context past the window, and keys before the
first query's window are never touched (a sliding layer's older pages may be gone).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tieredkv.model.matmul_attention import BLOCK_QUERIES, torch_softmax


def window_start(position: int, window: int) -> int:
    """The first key position that the query at `position` sees through a window of `window`."""
    return max(0, position - window + 1)


def band_mask(
    first_query: int, rows: int, first_key: int, keys: int, window: int, dtype: torch.dtype
) -> torch.Tensor:
    """(rows, keys) additive: 0 where query first_query + r sees key first_key + c."""
    query_pos = torch.arange(first_query, first_query + rows).unsqueeze(1)
    key_pos = torch.arange(first_key, first_key + keys).unsqueeze(0)
    hidden = (key_pos > query_pos) | (key_pos <= query_pos - window)
    return torch.zeros((rows, keys), dtype=dtype).masked_fill_(hidden, float("-inf"))


def window_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int,
    scale: float,
    softmax: Callable[[torch.Tensor], torch.Tensor] = torch_softmax,
) -> torch.Tensor:
    """Sliding-window attention of the last n positions: query i at kv_len - n + i.

    q (n, heads, d); keys/values (kv_heads, kv_len, d), any strides; `softmax` over the last
    dim of contiguous scores (in q's dtype: bf16 scores round as transformers' eager attention
    rounds them). Returns (n, heads, d)."""
    n, heads, head_dim = q.shape
    kv_heads, kv_len = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    offset = kv_len - n
    grouped = (q * scale).view(n, kv_heads, group, head_dim).transpose(0, 1)  # (kv, n, g, d)
    out = torch.empty((kv_heads, n, group, head_dim), dtype=q.dtype, device=q.device)
    for lo in range(0, n, BLOCK_QUERIES):
        hi = min(lo + BLOCK_QUERIES, n)
        rows, first = hi - lo, window_start(offset + lo, window)
        seen = offset + hi - first  # keys first .. offset + hi - 1
        queries = grouped[:, lo:hi].reshape(kv_heads, rows * group, head_dim)
        scores = torch.bmm(queries, keys[:, first : offset + hi].transpose(1, 2))
        if rows > 1 or seen > window:  # a single query's keys are exactly its window
            band = band_mask(offset + lo, rows, first, seen, window, scores.dtype)
            scores.view(kv_heads, rows, group, seen).add_(band.view(1, rows, 1, seen))
        probs = softmax(scores)  # (kv_heads, rows * group, seen)
        block = torch.bmm(probs, values[:, first : offset + hi])  # (kv_heads, rows * group, d)
        out[:, lo:hi] = block.view(kv_heads, rows, group, head_dim)
    return out.transpose(0, 1).reshape(n, heads, head_dim)

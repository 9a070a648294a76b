"""Causal attention of one sequence's new tokens over its contiguous KV, on torch's fused CPU
attention (SDPA): the unmasked decode, the masked short chunk, and the long chunk after a prefix
split into two flash calls merged by their log-sum-exp."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def suffix_mask(n: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive mask of n queries after kv_len - n keys, when `causal_attention` takes one:
    (n, kv_len), 0 where query i sees key j (j <= kv_len - n + i), -inf elsewhere. Additive in
    the model dtype, since SDPA converts a bool mask on every call (4k keys: 1.8 vs 1.3 ms)."""
    offset = kv_len - n
    if offset == 0 or n == 1 or _splits(n):
        return None
    key_pos = torch.arange(kv_len)
    hidden = key_pos.unsqueeze(0) > torch.arange(offset, kv_len).unsqueeze(1)
    return torch.zeros((n, kv_len), dtype=dtype).masked_fill_(hidden, float("-inf"))


def causal_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of the last n positions, query i at kv_len - n + i (bottom-right).

    All of it runs torch's fused CPU attention (SDPA), K/V never expanded for GQA. A decode
    step's single query sees every key: no mask (one query per head, 9 heads, shares the two
    threads better than the group folded into the query axis: 87 against 118 us at 1k keys).
    SDPA's `is_causal` aligns top-left, right only when there is no earlier context. After a
    prefix (a cached one, or earlier chunks), a short chunk passes a mask (`mask` if the caller
    built it once for all layers, see `suffix_mask`); a long one attends to the prefix and to
    itself separately, both unmasked or plainly causal, and merges the two by their log-sum-exp:
    a mask costs the kernel every masked block (2,048 queries after 6,144 keys, bf16: 79 ms a
    layer masked, 49 split). `scale`: the scores' (None: SDPA's 1/sqrt(head_dim)).
    Returns (n, heads, head_dim).
    """
    n = q.shape[0]
    kv_len = keys.shape[1]
    offset = kv_len - n
    if offset > 0 and _splits(n):
        return _prefix_then_diagonal(q, keys, values, offset, scale)
    if mask is None:
        mask = suffix_mask(n, kv_len, q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, heads, n, d)
        keys.unsqueeze(0),  # (1, kv_heads, kv_len, d)
        values.unsqueeze(0),
        attn_mask=mask,
        is_causal=offset == 0 and n > 1,
        enable_gqa=True,
        scale=scale,
    )  # (1, heads, n, d)
    return out[0].transpose(0, 1)


def _prefix_then_diagonal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, offset: int, scale: float | None
) -> torch.Tensor:
    """`causal_attention` after `offset` prefix keys, as two flash calls merged exactly.

    The kv heads are the batch and the `group` query heads of each are its heads, K/V broadcast
    over the group (stride 0, no copy): the flash op itself has no GQA.
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    grouped = q.view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # (kv, group, n, d)

    def part(start: int, end: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        k = keys[:, None, start:end].expand(kv_heads, group, end - start, head_dim)
        v = values[:, None, start:end].expand(kv_heads, group, end - start, head_dim)
        out, lse = _flash_with_lse(grouped, k, v, 0.0, causal, scale=scale)[:2]
        return out.float(), lse  # (kv, group, n, d), (kv, group, n) fp32

    out_prefix, lse_prefix = part(0, offset, causal=False)
    out_diag, lse_diag = part(offset, offset + n, causal=True)
    top = torch.maximum(lse_prefix, lse_diag)
    w_prefix = torch.exp(lse_prefix - top).unsqueeze(-1)
    w_diag = torch.exp(lse_diag - top).unsqueeze(-1)
    merged = (out_prefix * w_prefix + out_diag * w_diag) / (w_prefix + w_diag)
    return merged.to(q.dtype).permute(2, 0, 1, 3).reshape(n, heads, head_dim)


# aten's CPU flash attention, which also returns the log-sum-exp (None in a build without it)
_flash_with_lse = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_SPLIT_MIN_QUERIES = 256  # shorter chunks: one masked call is faster (64 queries: 0.8 vs 1.0 ms)


def _splits(n: int) -> bool:
    """Whether n queries after a prefix take the prefix-then-diagonal path."""
    return n >= _SPLIT_MIN_QUERIES and _flash_with_lse is not None

"""Causal attention as blocked batched matmuls, for bf16 on a CPU without AMX.

There torch's fused CPU attention (SDPA's flash kernel) is slow in bf16, for a long causal
prefill and for a single decode query alike, while oneDNN's bf16 matmuls run at full speed.
This path computes the scores with a bf16 `bmm`, adds the diagonal block's causal mask, takes a
bf16 softmax (fp32 inside) and a second `bmm` with the values; a decode's single query takes
plain matmuls per kv head.
It is what transformers' "eager" attention computes in bf16 (scores rounded to bf16 before the
softmax), so its rounding differs from the flash kernel's by bf16 steps; fp32 never comes here.

Queries go in blocks of `BLOCK_QUERIES`, each against the keys it can see, so a long causal
prefill does not score the masked half of the square and a block's scores stay in cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tieredkv.model.dtype import cpu_flags

BLOCK_QUERIES = 128  # a block's scores stay in cache; 64-256 perform alike, 128 best


def torch_softmax(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, dim=-1)


def matmul_causal_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    softmax: Callable[[torch.Tensor], torch.Tensor] = torch_softmax,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of the last n positions, query i at kv_len - n + i (bottom-right).

    q (n, heads, d); keys/values (kv_heads, kv_len, d), each head's tokens contiguous (a
    head-major workspace's view); other strides work, at the cost of a copy. `softmax`: over
    the last dim of contiguous bf16 scores, in place or not (`cpu_kernels` has one in C);
    `scale`: the scores' (None: 1/sqrt(d)). Returns (n, heads, d)."""
    n, heads, head_dim = q.shape
    kv_heads, kv_len = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    offset = kv_len - n
    # kv heads are the batch; a kv head's query heads sit side by side in the rows
    grouped = (q * (1.0 / math.sqrt(head_dim) if scale is None else scale)).view(
        n, kv_heads, group, head_dim
    )
    grouped = grouped.permute(1, 0, 2, 3).reshape(kv_heads, n * group, head_dim)
    if n <= BLOCK_QUERIES:  # a decode, or a short turn after a long history
        out = _one_block(grouped, keys, values, softmax, n)  # (kv_heads, n * group, d)
        return out.view(kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, heads, head_dim)
    # every block of queries reads the keys: lay them out once, transposed, for bmm
    keys_t, values = keys.transpose(1, 2).contiguous(), values.contiguous()
    out = torch.empty((n, kv_heads, group, head_dim), dtype=q.dtype, device=q.device)
    diagonal = _diagonal_mask(min(n, BLOCK_QUERIES), q.dtype, q.device)
    for lo in range(0, n, BLOCK_QUERIES):
        hi = min(lo + BLOCK_QUERIES, n)
        rows, seen = hi - lo, offset + hi  # this block's queries see keys 0..seen-1
        queries = grouped[:, lo * group : hi * group]
        scores = torch.bmm(queries, keys_t[:, :, :seen])  # (kv_heads, rows * group, seen)
        if rows > 1:  # the block's own square is causal
            square = scores.view(kv_heads, rows, group, seen)[..., offset + lo :]
            square.add_(diagonal[:rows, :rows].view(1, rows, 1, rows))
        probs = softmax(scores)
        block = torch.bmm(probs, values[:, :seen])  # (kv_heads, rows * group, d)
        out[lo:hi] = block.view(kv_heads, rows, group, head_dim).transpose(0, 1)
    return out.view(n, heads, head_dim)


def _one_block(
    grouped: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    softmax: Callable[[torch.Tensor], torch.Tensor],
    n: int,
) -> torch.Tensor:
    """All n queries in one block: grouped (kv_heads, n * group, d) scaled queries over all
    keys -> (kv_heads, n * group, d). One plain matmul per kv head, reading the keys and values
    where they lie: a head-major workspace's heads lie `capacity` tokens apart, which bmm (or a
    contiguous copy for it) would copy first: 45% of a decode step at 2.7k keys, and ~10 ms of
    a 64-token turn after 4k tokens (30 layers' keys and values, 94 MB)."""
    kv_heads, rows = grouped.shape[0], grouped.shape[1]
    kv_len = keys.shape[1]
    scores = grouped.new_empty((kv_heads, rows, kv_len))
    for head in range(kv_heads):
        torch.mm(grouped[head], keys[head].t(), out=scores[head])
    if n > 1:  # the queries' own square is causal
        group = rows // n
        square = scores.view(kv_heads, n, group, kv_len)[..., kv_len - n :]
        square.add_(_diagonal_mask(n, scores.dtype, scores.device).view(1, n, 1, n))
    probs = softmax(scores)
    out = grouped.new_empty(grouped.shape)
    for head in range(kv_heads):
        torch.mm(probs[head], values[head], out=out[head])
    return out


def matmul_decode_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decodes of S arena slots at once: queries (S, heads, 1, d), keys/values (S, kv_heads,
    kv_len, d) and the additive mask (S, 1, 1, kv_len) that hides each slot's keys past its
    end (and, for a sliding layer, before its window) -> (S, heads, 1, d); `scale` as in
    `matmul_causal_attention`. The slots' keys are copied into one batch (the arena's slots lie
    a whole slot apart): at eight 1k-token decodes one copy and two bmm a layer beat 48 small
    matmuls by several times."""
    slots, heads, _, head_dim = queries.shape
    kv_heads, kv_len = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    grouped = (queries * scale).view(slots * kv_heads, group, head_dim)
    batch_keys = keys.reshape(slots * kv_heads, kv_len, head_dim)  # a copy
    scores = torch.bmm(grouped, batch_keys.transpose(1, 2)).view(slots, kv_heads, group, kv_len)
    probs = torch.softmax(scores.add_(mask), dim=-1).view(slots * kv_heads, group, kv_len)
    out = torch.bmm(probs, values.reshape(slots * kv_heads, kv_len, head_dim))
    return out.view(slots, heads, 1, head_dim)


def _diagonal_mask(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(size, size) additive: 0 on and below the diagonal, -inf above it."""
    return torch.full((size, size), float("-inf"), dtype=dtype, device=device).triu_(1)


def prefers_matmul_attention(
    dtype: torch.dtype, device: torch.device, flags: frozenset[str] | None = None
) -> bool:
    """Whether this path beats SDPA here: bf16 on a CPU with AVX512-BF16 but without AMX.
    With AMX, SDPA's flash kernel is the faster one; on a CPU that emulates bf16 it is too
    (emulated bf16 matmuls are slower still); fp32 stays on SDPA, whose outputs match
    transformers' exactly."""
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16:
        return False
    flags = cpu_flags() if flags is None else flags
    return "amx_bf16" not in flags and "avx512_bf16" in flags


def prefers_c_decode(
    dtype: torch.dtype, device: torch.device, flags: frozenset[str] | None = None
) -> bool:
    """Whether a step's decodes should attend in C (`cpu_kernels`, bf16 only): bf16 on a CPU
    without AMX, whichever path its longer chunks take. Where bf16 is emulated SDPA's decode was
    the slow one: a batch-1 step at 3k tokens 137 ms against 42 ms with the C decode."""
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16:
        return False
    return "amx_bf16" not in (cpu_flags() if flags is None else flags)

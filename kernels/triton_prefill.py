"""Triton paged prefill-with-prefix attention (contract: `reference.paged_prefill_attention`).

One program owns BLOCK_M queries of one sequence and one query head, and streams that sequence's
keys through an online softmax (flash attention), BLOCK_N keys at a time. Each key's page comes
from the page table, so pages may sit anywhere in the pool in any order. Positions:

  sequence keys          0 ......................... kv_len - 1
  query row m (0-based)  q_pos = kv_len - q_len + m, attends keys 0 .. q_pos
  block's key range      0 .. min(kv_len, kv_len - q_len + (block + 1) * BLOCK_M) - 1

With a sliding window of W tokens (SLIDING) row m attends keys q_pos - W + 1 .. q_pos, and the
block reads keys from its first row's first one, q_pos(first row) - W + 1, on: older keys of a
sliding layer may no longer be in the pages.

Without a window every valid row attends key 0, so after the first key block each row's running
max is finite. With one, a row may see no key of the first blocks: its max stays -inf and the
exponent is taken against 0 instead, so no row ever computes exp(-inf - -inf).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_attention_args, check_window
from .triton_paged_kv import load_kv_block
from .triton_support import check_device, dot_in_fp32, dot_precision

_LOG2_E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, query_start_ptr, kv_lens_ptr,
    qk_scale,  # softmax scale * log2(e): the kernel uses exp2
    window,  # the sliding window in tokens (read only when SLIDING)
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_pt,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, SLIDING: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_begin = tl.load(query_start_ptr + seq).to(tl.int64)
    q_len = tl.load(query_start_ptr + seq + 1).to(tl.int64) - q_begin
    if m_block * BLOCK_M >= q_len:
        return
    kv_len = tl.load(kv_lens_ptr + seq).to(tl.int64)
    kv_head = head // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of this sequence
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_pos = kv_len - q_len + offs_m  # (BLOCK_M,) absolute positions
    q_rows = q_ptr + (q_begin + offs_m)[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    kv_stop = tl.minimum(kv_len, kv_len - q_len + (m_block + 1) * BLOCK_M)
    first_key = kv_len * 0  # no key before it is read (a window's older keys may be gone)
    if SLIDING:
        first_key = tl.maximum(kv_len - q_len + m_block * BLOCK_M - window + 1, 0)
    for start_n in range(first_key // BLOCK_N * BLOCK_N, kv_stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        n_ok = (offs_n < kv_len) & (offs_n >= first_key)
        k, v = load_kv_block(
            k_ptr, v_ptr, page_table_ptr, seq, stride_pt, offs_n, n_ok, offs_d, d_ok, kv_head,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            PAGE_SIZE, DOT_FP32,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        allowed = (offs_n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if SLIDING:
            allowed = allowed & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if SLIDING:  # a row that has seen no key yet: its max is still -inf
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if SLIDING:  # padding rows past q_len may have seen no key: 0 / 0 otherwise
        l_i = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_i[:, None]
    out_rows = out_ptr + (q_begin + offs_m)[:, None] * stride_ot + head * stride_oh
    tl.store(
        out_rows + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    query_start: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    *,
    max_q_len: int | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Triton version of `reference.paged_prefill_attention` (same arguments and result).

    Values are not checked (that would sync the device): kv_lens[i] >= q_len_i >= 0, and every
    page id the first ceil(kv_lens[i] / page_size) entries of row i name is in the pool.
    max_q_len: an upper bound on any sequence's q_len, if the caller knows one on the host
    (default: num_tokens; surplus programs exit at once). block_m, block_n: powers of two >= 16.
    """
    dims = check_attention_args(q, k_pages, v_pages, page_table, query_start, kv_lens)
    check_window(window)
    for name, tensor in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        check_device(name, tensor)
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name}: must be a power of two >= 16, got {block}")
    num_tokens = q.shape[0]
    out = torch.empty((num_tokens, dims.num_heads, dims.head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or dims.batch == 0:
        return out
    bound = num_tokens if max_q_len is None else min(max_q_len, num_tokens)
    grid = (dims.batch, dims.num_heads, triton.cdiv(max(bound, 1), block_m))
    _prefill_kernel[grid](
        q, k_pages, v_pages, out, page_table, query_start, kv_lens,
        scale * _LOG2_E, window or 0,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        out.stride(0), out.stride(1), page_table.stride(0),
        HEAD_DIM=dims.head_dim, PAGE_SIZE=dims.page_size, GROUP=dims.num_queries_per_kv,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(dims.head_dim)),
        DOT_FP32=dot_in_fp32(q.dtype), PRECISION=dot_precision(q.dtype),
        SLIDING=window is not None,
    )  # fmt: skip
    return out

"""Triton paged decode attention (same contract as `reference.paged_decode_attention`).

Flash-decoding in two launches. Pass 1: one program per (sequence, kv head, split) attends the
GROUP query heads that share the kv head (so each key is loaded once per group) over one split
of the sequence's keys, and writes a normalised partial output plus its log2-sum-exp. Pass 2:
one program per (sequence, query head) merges the splits, weighting each by 2^(lse - max lse).

  split s covers keys  s * split_len .. min(kv_len, (s + 1) * split_len) - 1
  with a window of W tokens (SLIDING) a split starts at kv_len - W at the earliest
  an empty split (s * split_len >= kv_len, or before the window) writes lse = -inf and weighs 0

The split count comes from the page table's width, not from kv_lens, so launching never reads
device values (no sync; safe for CUDA graphs). The split holding the last key is never empty
(kv_len >= 1), so the merge's max is finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import AttentionDims, check_attention_args, check_window
from .triton_paged_kv import load_kv_block
from .triton_support import (
    check_device,
    dot_in_fp32,
    dot_precision,
    num_compute_units,
)

_LOG2_E = 1.4426950408889634
_MIN_SPLIT_TOKENS = 256  # below this a split's fixed cost outweighs the parallelism it adds


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, page_table_ptr, kv_lens_ptr, part_out_ptr, part_lse_ptr,
    qk_scale, split_len, window,
    stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_pt,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, SLIDING: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    num_heads = tl.num_programs(1) * GROUP
    kv_len = tl.load(kv_lens_ptr + seq).to(tl.int64)
    split_begin = split.to(tl.int64) * split_len
    split_end = tl.minimum(kv_len, split_begin + split_len)
    if SLIDING:  # the new token sees keys kv_len - window .. kv_len - 1
        split_begin = tl.maximum(split_begin, kv_len - window)

    offs_h = tl.arange(0, BLOCK_H)  # (BLOCK_H,) the group's heads, padded
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q_rows = q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start_n in range(split_begin, split_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        n_ok = offs_n < split_end
        k, v = load_kv_block(
            k_ptr, v_ptr, page_table_ptr, seq, stride_pt, offs_n, n_ok, offs_d, d_ok, kv_head,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            PAGE_SIZE, DOT_FP32,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_H, BLOCK_N)
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    # part_out (batch, num_heads, num_splits, BLOCK_D) fp32, part_lse (batch, num_heads, splits)
    part_rows = (seq * num_heads + heads).to(tl.int64) * num_splits + split
    tl.store(part_lse_ptr + part_rows, lse, mask=h_ok)
    part_ptrs = part_out_ptr + part_rows[:, None] * BLOCK_D + offs_d[None, :]
    tl.store(part_ptrs, out, mask=h_ok[:, None])


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = (seq * tl.num_programs(1) + head).to(tl.int64) * num_splits
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row + offs_s, mask=s_ok, other=float("-inf"))  # (BLOCK_S,)
    weight = tl.exp2(lse - tl.max(lse, 0))  # the last key's split is never empty: max finite
    parts = tl.load(
        part_out_ptr + (row + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
        mask=s_ok[:, None],
        other=0.0,
    )  # (BLOCK_S, BLOCK_D)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    out_ptrs = out_ptr + seq.to(tl.int64) * stride_ob + head * stride_oh + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def choose_num_splits(dims: AttentionDims, device: torch.device) -> int:
    """Enough (sequence, kv head, split) programs to fill the device about twice, no split
    shorter than _MIN_SPLIT_TOKENS of the page table's capacity."""
    capacity = dims.max_pages_per_seq * dims.page_size
    wanted = triton.cdiv(2 * num_compute_units(device), max(dims.batch * dims.num_kv_heads, 1))
    return max(1, min(wanted, capacity // _MIN_SPLIT_TOKENS))


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    *,
    num_splits: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """Triton version of `reference.paged_decode_attention` (same arguments and result).

    Values are not checked (that would sync the device): kv_lens[i] >= 1, and every page id
    the first ceil(kv_lens[i] / page_size) entries of row i name is in the pool.
    num_splits: key splits per sequence (default: `choose_num_splits`); block_n: a power of two
    >= 16.
    """
    dims = check_attention_args(q, k_pages, v_pages, page_table, None, kv_lens)
    check_window(window)
    for name, tensor in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        check_device(name, tensor)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n: must be a power of two >= 16, got {block_n}")
    if num_splits is None:
        num_splits = choose_num_splits(dims, q.device)
    if num_splits < 1:
        raise ValueError(f"num_splits: must be >= 1, got {num_splits}")
    out = torch.empty((dims.batch, dims.num_heads, dims.head_dim), dtype=q.dtype, device=q.device)
    if dims.batch == 0:
        return out
    capacity = dims.max_pages_per_seq * dims.page_size
    split_len = triton.cdiv(triton.cdiv(capacity, num_splits), block_n) * block_n
    block_d = max(16, triton.next_power_of_2(dims.head_dim))
    part_shape = (dims.batch, dims.num_heads, num_splits)
    part_out = torch.empty((*part_shape, block_d), dtype=torch.float32, device=q.device)
    part_lse = torch.empty(part_shape, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(dims.batch, dims.num_kv_heads, num_splits)](
        q, k_pages, v_pages, page_table, kv_lens, part_out, part_lse,
        scale * _LOG2_E, split_len, window or 0,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2), page_table.stride(0),
        HEAD_DIM=dims.head_dim, PAGE_SIZE=dims.page_size, GROUP=dims.num_queries_per_kv,
        BLOCK_H=max(16, triton.next_power_of_2(dims.num_queries_per_kv)),
        BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_FP32=dot_in_fp32(q.dtype), PRECISION=dot_precision(q.dtype),
        SLIDING=window is not None,
    )  # fmt: skip
    _decode_merge_kernel[(dims.batch, dims.num_heads)](
        part_out, part_lse, out, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=dims.head_dim, BLOCK_S=max(2, triton.next_power_of_2(num_splits)), BLOCK_D=block_d,
    )  # fmt: skip
    return out

"""The one paged K/V block load both Triton attention kernels share (imports triton)."""

import triton
import triton.language as tl


@triton.jit
def load_kv_block(
    k_ptr, v_ptr, page_table_ptr, seq, stride_pt, offs_n, n_ok, offs_d, d_ok, kv_head,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    PAGE_SIZE: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    """K and V (BLOCK_N, BLOCK_D) of key positions `offs_n` of sequence `seq`, read from its
    pages in place; masked positions load 0. fp32 when interpreting (bf16 dots are wrong there)."""
    page = tl.load(page_table_ptr + seq * stride_pt + offs_n // PAGE_SIZE, mask=n_ok, other=0)
    page = page.to(tl.int64)
    in_page = offs_n % PAGE_SIZE
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k_off = page * stride_kp + in_page * stride_ks + kv_head * stride_kh
    k = tl.load(k_ptr + k_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v_off = page * stride_vp + in_page * stride_vs + kv_head * stride_vh
    v = tl.load(v_ptr + v_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v

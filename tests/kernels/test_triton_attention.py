"""Triton paged attention against the torch reference (interpreted on CPU, compiled on CUDA).

Small shapes: the interpreter runs every program in Python. Blocks of 16 make the kernels walk
several query and key blocks and cross page boundaries inside a block.
"""

import pytest
import torch
from paged_case import make_case, naive_attention
from tieredkv.kernels import reference

# Ragged: q_len 1 after a prefix, a prompt with no prefix, q_len 1 with no prefix, a 20-token
# suffix over two query blocks; sequences ending on and off page boundaries of 4, 8 and 16.
Q_LENS = [1, 5, 9, 1, 20]
KV_LENS = [32, 16, 9, 1, 37]
DECODE_KV_LENS = [1, 4, 17, 45, 64]
# (num_heads, num_kv_heads, head_dim): MHA, GQA with a group of 3, and the default model's
# shapes (9 query heads over 3 kv heads of 64)
HEADS = [(2, 2, 16), (6, 2, 16), (9, 3, 64)]


def tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("page_size", [4, 8, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_reference(
    triton_kernels, device, page_size, num_heads, num_kv_heads, head_dim, dtype
):
    case = make_case(Q_LENS, KV_LENS, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, page_size=page_size, dtype=dtype,
                     device=device)  # fmt: skip
    out = triton_kernels.paged_prefill_attention(*case.prefill_args(), block_m=16, block_n=16)
    expected = reference.paged_prefill_attention(*case.prefill_args())
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_prefill_default_blocks_and_head_dim_padding(triton_kernels, device):
    # head_dim 24 is not a power of two: the kernel pads it to 32 and masks the rest.
    case = make_case(Q_LENS, KV_LENS, num_heads=4, num_kv_heads=1, head_dim=24, page_size=8,
                     device=device)  # fmt: skip
    out = triton_kernels.paged_prefill_attention(*case.prefill_args(), max_q_len=max(Q_LENS))
    torch.testing.assert_close(out, naive_attention(case, Q_LENS), atol=1e-5, rtol=1e-5)


def test_prefill_reads_strided_q(triton_kernels, device):
    # q as the model slices it out of a fused projection: rows of stride 3 * heads * d.
    case = make_case(Q_LENS, KV_LENS, num_heads=6, num_kv_heads=2, head_dim=16, page_size=4,
                     device=device)  # fmt: skip
    fused = torch.randn(case.q.shape[0], 3, 6, 16, device=device)
    fused[:, 1] = case.q
    q = fused[:, 1]
    assert not q.is_contiguous()
    args = (q, *case.prefill_args()[1:])
    out = triton_kernels.paged_prefill_attention(*args, block_m=16, block_n=16)
    torch.testing.assert_close(out, reference.paged_prefill_attention(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("page_size", [4, 8, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_matches_reference(
    triton_kernels, device, page_size, num_heads, num_kv_heads, head_dim, dtype
):
    q_lens = [1] * len(DECODE_KV_LENS)
    case = make_case(q_lens, DECODE_KV_LENS, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, page_size=page_size, dtype=dtype,
                     device=device)  # fmt: skip
    expected = reference.paged_decode_attention(*case.decode_args())
    # 3 splits: the short sequences leave splits empty (lse = -inf) that the merge must ignore.
    for num_splits in (1, 3):
        out = triton_kernels.paged_decode_attention(
            *case.decode_args(), num_splits=num_splits, block_n=16
        )
        assert out.dtype == dtype and not out.isnan().any()
        torch.testing.assert_close(out, expected, **tolerance(dtype))


def test_decode_default_splits_matches_dense_attention(triton_kernels, device):
    q_lens = [1] * len(DECODE_KV_LENS)
    case = make_case(q_lens, DECODE_KV_LENS, num_heads=9, num_kv_heads=3, head_dim=16,
                     page_size=16, device=device)  # fmt: skip
    out = triton_kernels.paged_decode_attention(*case.decode_args())
    torch.testing.assert_close(out, naive_attention(case, q_lens), atol=1e-5, rtol=1e-5)


def test_prefill_of_single_tokens_equals_decode(triton_kernels, device):
    q_lens = [1] * len(DECODE_KV_LENS)
    case = make_case(q_lens, DECODE_KV_LENS, num_heads=6, num_kv_heads=2, head_dim=16,
                     page_size=8, dtype=torch.bfloat16, device=device)  # fmt: skip
    prefill = triton_kernels.paged_prefill_attention(*case.prefill_args(), block_n=16)
    decode = triton_kernels.paged_decode_attention(*case.decode_args(), block_n=16)
    torch.testing.assert_close(prefill, decode, atol=2e-2, rtol=2e-2)


def test_int64_metadata_gives_the_same_result(triton_kernels, device):
    case = make_case(Q_LENS, KV_LENS, num_heads=6, num_kv_heads=2, head_dim=16, page_size=8,
                     device=device)  # fmt: skip
    q, k, v, table, starts, lens, scale = case.prefill_args()
    wide = (q, k, v, table.long(), starts.long(), lens.long(), scale)
    out = triton_kernels.paged_prefill_attention(*wide, block_m=16, block_n=16)
    torch.testing.assert_close(out, reference.paged_prefill_attention(*case.prefill_args()))
    decode = make_case([1, 1], [7, 30], num_heads=6, num_kv_heads=2, head_dim=16, page_size=8,
                       device=device)  # fmt: skip
    q, k, v, table, lens, scale = decode.decode_args()
    out = triton_kernels.paged_decode_attention(q, k, v, table.long(), lens.long(), scale)
    torch.testing.assert_close(out, reference.paged_decode_attention(*decode.decode_args()))

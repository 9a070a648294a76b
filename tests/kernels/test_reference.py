"""The torch reference kernels against dense per-sequence attention and plain indexing."""

import pytest
import torch
import torch.nn.functional as F
from paged_case import make_case, naive_attention
from tieredkv.kernels import reference

# Ragged: q_len 1 after a prefix, a whole prompt with no prefix, q_len 1 with no prefix, and
# sequences ending on and off page boundaries for page sizes 4, 8 and 16.
Q_LENS = [1, 5, 9, 1, 20]
KV_LENS = [32, 16, 9, 1, 37]


@pytest.mark.parametrize("page_size", [4, 8, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (6, 2), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_dense_attention(page_size, num_heads, num_kv_heads, dtype):
    case = make_case(
        Q_LENS,
        KV_LENS,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=8,
        page_size=page_size,
        dtype=dtype,
    )
    out = reference.paged_prefill_attention(*case.prefill_args())
    assert out.shape == case.q.shape and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, naive_attention(case, Q_LENS), atol=tol, rtol=tol)


@pytest.mark.parametrize("page_size", [4, 16])
def test_decode_matches_dense_attention(page_size):
    kv_lens = [1, 4, 17, 32]
    q_lens = [1] * len(kv_lens)
    case = make_case(q_lens, kv_lens, num_heads=6, num_kv_heads=3, head_dim=8, page_size=page_size)
    out = reference.paged_decode_attention(*case.decode_args())
    torch.testing.assert_close(out, naive_attention(case, q_lens), atol=1e-5, rtol=1e-5)


def test_suffix_mask_is_aligned_bottom_right():
    # 2 new tokens after a 6-token prefix: the first attends 7 keys, the second all 8. SDPA's
    # is_causal=True would let the first see only key 0 (top-left alignment).
    case = make_case([2], [8], num_heads=1, num_kv_heads=1, head_dim=4, page_size=4)
    out = reference.paged_prefill_attention(*case.prefill_args())
    q = case.q.transpose(0, 1)  # (heads, 2, d)
    k, v = case.keys[0].transpose(0, 1), case.values[0].transpose(0, 1)  # (heads, 8, d)
    last = F.scaled_dot_product_attention(q[:, 1:], k, v, scale=case.scale)
    first = F.scaled_dot_product_attention(q[:, :1], k[:, :7], v[:, :7], scale=case.scale)
    torch.testing.assert_close(out[1], last[:, 0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out[0], first[:, 0], atol=1e-6, rtol=1e-6)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=case.scale)
    assert not torch.allclose(out[0], top_left[:, 0])


def test_gather_then_scatter_moves_exact_bytes():
    pool = torch.randn(3, 2, 10, 4, 2, 8).to(torch.bfloat16)
    page_ids = torch.tensor([7, 2, 9, 0])
    staging = reference.gather_pages(pool, page_ids)
    assert staging.shape == (4, 3, 2, 4, 2, 8)
    for i, page in enumerate(page_ids.tolist()):
        assert torch.equal(staging[i], pool[:, :, page])
    target = torch.zeros_like(pool)
    reference.scatter_pages(target, page_ids, staging)
    assert torch.equal(target[:, :, page_ids], pool[:, :, page_ids])
    untouched = [p for p in range(10) if p not in page_ids.tolist()]
    assert not target[:, :, untouched].any()
    out = torch.empty_like(staging)
    assert reference.gather_pages(pool, page_ids, out=out) is out
    assert torch.equal(out, staging)


def test_prefill_refuses_kv_len_shorter_than_q_len():
    case = make_case([3], [3], num_heads=2, num_kv_heads=2, head_dim=4, page_size=4)
    q, k, v, table, starts, _, scale = case.prefill_args()
    with pytest.raises(ValueError, match="kv_lens"):
        reference.paged_prefill_attention(q, k, v, table, starts, torch.tensor([2]).int(), scale)

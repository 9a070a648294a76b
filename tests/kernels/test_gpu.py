"""Compiled Triton kernels on CUDA at the default model's head shapes (skipped without CUDA)."""

import pytest
import torch
from paged_case import make_case
from tieredkv.kernels import reference, select_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# Ragged and realistic: long prefixes, a decode-like row, a prompt without prefix.
Q_LENS = [1, 300, 77, 128]
KV_LENS = [1500, 300, 1029, 2048]


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    from tieredkv.kernels.triton_support import INTERPRETING

    if INTERPRETING:
        pytest.skip("TRITON_INTERPRET is set: these tests are for compiled kernels")
    return select_backend(torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_on_gpu(kernels, dtype):
    assert kernels.name == "triton"
    case = make_case(Q_LENS, KV_LENS, num_heads=9, num_kv_heads=3, head_dim=64, page_size=16,
                     dtype=dtype, device="cuda")  # fmt: skip
    out = kernels.paged_prefill_attention(*case.prefill_args())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    expected = reference.paged_prefill_attention(*case.prefill_args())
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_decode_on_gpu(kernels, num_splits):
    kv_lens = [1, 16, 17, 1000, 4096, 333, 2048, 5]
    q_lens = [1] * len(kv_lens)
    case = make_case(q_lens, kv_lens, num_heads=9, num_kv_heads=3, head_dim=64, page_size=16,
                     dtype=torch.bfloat16, device="cuda")  # fmt: skip
    out = kernels.paged_decode_attention(*case.decode_args(), num_splits=num_splits)
    expected = reference.paged_decode_attention(*case.decode_args())
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def test_gather_scatter_on_gpu(kernels):
    pool = torch.randn(30, 2, 200, 16, 3, 64, device="cuda").to(torch.bfloat16)
    page_ids = torch.randperm(200, device="cuda")[:64]
    staging = kernels.gather_pages(pool, page_ids)
    assert torch.equal(staging, reference.gather_pages(pool, page_ids))
    target = torch.zeros_like(pool)
    kernels.scatter_pages(target, page_ids, staging)
    assert torch.equal(target[:, :, page_ids], pool[:, :, page_ids])
    assert target.count_nonzero() == staging.count_nonzero()

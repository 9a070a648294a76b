"""Random ragged batches: Triton prefill and decode against the reference (derandomized)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_case import make_case
from tieredkv.kernels import reference


@st.composite
def batches(draw):
    """Per sequence (q_len, kv_len) with 1 <= q_len <= kv_len, plus head and page shapes."""
    sizes = draw(
        st.lists(st.tuples(st.integers(1, 24), st.integers(0, 40)), min_size=1, max_size=4)
    )
    q_lens = [q_len for q_len, _ in sizes]
    kv_lens = [q_len + prefix for q_len, prefix in sizes]
    num_kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 3, 4]))
    head_dim = draw(st.sampled_from([8, 16, 32, 64]))
    page_size = draw(st.sampled_from([4, 8, 16]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return q_lens, kv_lens, num_kv_heads * group, num_kv_heads, head_dim, page_size, dtype


@settings(max_examples=8, deadline=None, derandomize=True)
@given(batch=batches(), seed=st.integers(0, 2**16))
def test_random_batches_match_reference(triton_kernels, device, batch, seed):
    q_lens, kv_lens, num_heads, num_kv_heads, head_dim, page_size, dtype = batch
    case = make_case(q_lens, kv_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, page_size=page_size, dtype=dtype, device=device,
                     seed=seed)  # fmt: skip
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    out = triton_kernels.paged_prefill_attention(*case.prefill_args(), block_m=16, block_n=16)
    torch.testing.assert_close(out, reference.paged_prefill_attention(*case.prefill_args()), **tol)
    # Decode: the last token of each sequence over the same pages.
    last = case.query_start[1:].long() - 1
    args = (case.q[last], *case.decode_args()[1:])
    out = triton_kernels.paged_decode_attention(*args, num_splits=2, block_n=16)
    torch.testing.assert_close(out, reference.paged_decode_attention(*args), **tol)

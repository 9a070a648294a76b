"""The CPU attention paths against a dense reference with an explicit bottom-right mask."""

import pytest
import torch

from tieredkv.model.attention import causal_attention


def dense_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    n, heads, dim = q.shape
    kv_heads, kv_len = keys.shape[:2]
    k = keys.double().repeat_interleave(heads // kv_heads, 0)  # (heads, kv_len, dim)
    v = values.double().repeat_interleave(heads // kv_heads, 0)
    scores = torch.einsum("nhd,hkd->hnk", q.double(), k) / dim**0.5
    positions = torch.arange(kv_len - n, kv_len).unsqueeze(1)
    scores.masked_fill_(torch.arange(kv_len).unsqueeze(0) > positions, float("-inf"))
    return torch.einsum("hnk,hkd->nhd", scores.softmax(-1), v)


@pytest.mark.parametrize(
    ("n", "kv_len"),
    [(1, 1), (1, 37), (5, 5), (19, 19), (7, 40), (33, 33), (300, 1100), (256, 256), (260, 300)],
)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_causal_attention_matches_dense(n, kv_len, heads, kv_heads) -> None:
    generator = torch.Generator().manual_seed(n * 1000 + kv_len)
    q = torch.randn(n, heads, 16, generator=generator)
    keys = torch.randn(kv_heads, kv_len, 16, generator=generator)
    values = torch.randn(kv_heads, kv_len, 16, generator=generator)
    expected = dense_reference(q, keys, values)
    got = causal_attention(q, keys, values)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_causal_attention_reads_strided_workspace_views() -> None:
    """The workspace hands attention the first kv_len tokens of a longer buffer."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(24, 6, 64, generator=generator)
    buffer = torch.randn(2, 2, 512, 64, generator=generator)  # (K/V, kv_heads, capacity, d)
    keys, values = buffer[0, :, :100], buffer[1, :, :100]
    expected = dense_reference(q, keys, values)
    got = causal_attention(q, keys, values)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_causal_attention_in_bf16_stays_close() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(300, 9, 64, generator=generator)
    keys = torch.randn(3, 420, 64, generator=generator)
    values = torch.randn(3, 420, 64, generator=generator)
    expected = dense_reference(q, keys, values).float()
    got = causal_attention(q.bfloat16(), keys.bfloat16(), values.bfloat16()).float()
    assert (got - expected).abs().mean() < 5e-3
    assert (got - expected).abs().max() < 0.1

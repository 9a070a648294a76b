"""The CPU attention paths against a dense reference with an explicit bottom-right mask."""

import pytest
import torch

from tieredkv.model.causal_attention import causal_attention
from tieredkv.model.matmul_attention import (
    matmul_causal_attention,
    prefers_c_decode,
    prefers_matmul_attention,
)


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


@pytest.mark.parametrize(
    ("n", "kv_len"),
    [(1, 1), (1, 37), (5, 5), (19, 40), (128, 128), (129, 129), (300, 1100), (260, 300)],
)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_matmul_attention_matches_dense(n, kv_len, heads, kv_heads) -> None:
    """The blocked-matmul path (bf16 without AMX) computes the same attention: exact in fp32,
    across block edges (128 queries a block) and after a prefix."""
    generator = torch.Generator().manual_seed(n * 1000 + kv_len + 7)
    q = torch.randn(n, heads, 16, generator=generator)
    keys = torch.randn(kv_heads, kv_len, 16, generator=generator)
    values = torch.randn(kv_heads, kv_len, 16, generator=generator)
    got = matmul_causal_attention(q, keys, values)
    torch.testing.assert_close(got.double(), dense_reference(q, keys, values), rtol=1e-5, atol=1e-5)


def test_matmul_attention_reads_strided_workspace_views_in_bf16() -> None:
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(300, 9, 64, generator=generator)
    buffer = torch.randn(420, 2, 3, 64, generator=generator)  # the workspace: (len, K/V, kv, d)
    keys, values = buffer[:, 0].transpose(0, 1), buffer[:, 1].transpose(0, 1)
    expected = dense_reference(q, keys, values).float()
    got = matmul_causal_attention(q.bfloat16(), keys.bfloat16(), values.bfloat16()).float()
    assert (got - expected).abs().mean() < 5e-3
    assert (got - expected).abs().max() < 0.1


def test_matmul_attention_is_chosen_for_bf16_on_a_cpu_with_avx512_bf16_without_amx() -> None:
    cpu = torch.device("cpu")
    assert prefers_matmul_attention(torch.bfloat16, cpu, frozenset({"avx512_bf16"}))
    assert not prefers_matmul_attention(torch.bfloat16, cpu, frozenset({"amx_bf16"}))
    assert not prefers_matmul_attention(torch.bfloat16, cpu, frozenset({"avx512f"}))  # emulated
    assert not prefers_matmul_attention(torch.float32, cpu, frozenset({"avx512_bf16"}))


def test_c_decode_is_chosen_for_bf16_on_any_cpu_without_amx() -> None:
    cpu = torch.device("cpu")
    assert prefers_c_decode(torch.bfloat16, cpu, frozenset({"avx512_bf16"}))
    assert prefers_c_decode(torch.bfloat16, cpu, frozenset({"avx512f"}))
    assert not prefers_c_decode(torch.bfloat16, cpu, frozenset({"amx_bf16", "avx512_bf16"}))
    assert not prefers_c_decode(torch.float32, cpu, frozenset({"avx512f"}))
    assert not prefers_c_decode(torch.bfloat16, torch.device("meta"), frozenset())

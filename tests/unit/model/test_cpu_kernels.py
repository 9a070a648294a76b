"""The C decode-step kernels (tieredkv/model/cpu_kernels.c) against float64 references: one
new token per sequence attends over its workspace (the kernel also stores that token's K/V),
for several sequences of different lengths at once, across the kernel's key chunks, with
grouped queries, several head sizes and both workspace kinds (arena slots, spares); RMSNorm
rounded exactly as transformers rounds it in bf16; RoPE and SiLU-and-multiply equal to the eager
torch chains they replace, bit for bit; softmax as torch's bf16 softmax; a bf16 weight times a
few rows as the fp32 product of the same values, rounded once."""

from __future__ import annotations

import pytest
import torch

from tieredkv.model.cpu_kernels import FEW_ROWS, decode_table, load_cpu_kernels
from tieredkv.model.pointwise import silu_and_mul
from tieredkv.model.rope import apply_rope

KERNELS = load_cpu_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="gcc could not build the CPU kernels")
BF16 = torch.bfloat16


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q (heads, d) over keys/values (kv_heads, n, d), float64 -> (heads, d)."""
    heads, dim = q.shape
    kv_heads = keys.shape[0]
    grouped = q.double().view(kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("hgd,hnd->hgn", grouped, keys.double()) / dim**0.5
    out = torch.einsum("hgn,hnd->hgd", torch.softmax(scores, -1), values.double())
    return out.reshape(heads, dim)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 64), (8, 2, 128), (4, 2, 16)]
)
def test_decodes_of_several_sequences_equal_the_reference(
    heads: int, kv_heads: int, dim: int
) -> None:
    torch.manual_seed(heads + dim)
    layers, capacity = 3, 800
    arena = torch.randn(2, layers, 2, kv_heads, capacity, dim).to(BF16)  # two slots
    spare = torch.randn(layers, 2, kv_heads, 300, dim).to(BF16)
    lengths = [1, 257, 700]  # one key; past one 256-key chunk; several chunks
    workspaces = [spare, arena[1], arena[0]]
    qkv = torch.randn(4, (heads + 2 * kv_heads) * dim).to(BF16)  # row 0 is no decode's
    q = qkv[:, : heads * dim].view(4, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(4, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(4, kv_heads, dim)
    layer = 2
    table = decode_table(
        [(row + 1, ws, n) for row, (ws, n) in enumerate(zip(workspaces, lengths, strict=True))]
    )
    out = torch.full((4, heads, dim), 7.0, dtype=BF16)
    KERNELS.decode_attention(table, layer, q, k, v, out)
    assert torch.equal(out[0], torch.full((heads, dim), 7.0, dtype=BF16))  # untouched
    for row, (ws, n) in enumerate(zip(workspaces, lengths, strict=True), start=1):
        keys, values = ws[layer, 0, :, :n], ws[layer, 1, :, :n]
        assert torch.equal(keys[:, n - 1], k[row]) and torch.equal(values[:, n - 1], v[row])
        expected = reference(q[row], keys, values)
        # fp32 inside; the only bf16 step is the output's rounding
        torch.testing.assert_close(out[row].double(), expected, rtol=8e-3, atol=1e-3)


def test_other_layers_and_positions_are_left_alone() -> None:
    torch.manual_seed(3)
    ws = torch.randn(2, 2, 3, 64, 64).to(BF16)
    before = ws.clone()
    q, k, v = (torch.randn(1, h, 64).to(BF16) for h in (9, 3, 3))
    KERNELS.decode_attention(
        decode_table([(0, ws, 40)]), 1, q, k, v, torch.empty(1, 9, 64, dtype=BF16)
    )
    changed = (ws != before).nonzero()[:, [0, 1, 3]].unique(dim=0).tolist()
    assert all(layer == 1 and position == 39 for layer, _, position in changed)


def test_a_group_beyond_the_kernels_limit_is_refused() -> None:
    ws = torch.zeros(1, 2, 1, 8, 64, dtype=BF16)
    q, kv = torch.zeros(1, 32, 64, dtype=BF16), torch.zeros(1, 1, 64, dtype=BF16)
    with pytest.raises(ValueError, match="unsupported shape"):
        KERNELS.decode_attention(decode_table([(0, ws, 4)]), 0, q, kv, kv, torch.empty_like(q))


@pytest.mark.parametrize("rows", [1, 8, 130])  # 130: rows split over threads
def test_rms_norm_rounds_as_transformers_does(rows: int) -> None:
    torch.manual_seed(rows)
    x = (torch.randn(rows, 576) * 3).to(BF16)
    weight = torch.randn(576).to(BF16)
    upcast = x.float()
    expected = weight * (upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + 1e-5)).to(BF16)
    out = KERNELS.rms_norm(x, weight, 1e-5)
    # fp32 sums in another order may move a rare value by one bf16 step; nearly all are equal
    torch.testing.assert_close(out.float(), expected.float(), rtol=2**-7, atol=0)
    assert (out == expected).float().mean() > 0.99


@pytest.mark.parametrize("cols", [1, 100, 1088, 20_000])  # 20,000: past the kernel's row buffer
def test_softmax_in_place_equals_torchs_bf16_softmax(cols: int) -> None:
    torch.manual_seed(cols)
    scores = (torch.randn(2, 3, cols) * 4).to(BF16)
    scores[0, 1, cols // 2 + 1 :] = float("-inf")  # a causal mask's -inf get weight 0
    expected = torch.softmax(scores, dim=-1)
    out = KERNELS.softmax_(scores.clone())
    torch.testing.assert_close(out.float(), expected.float(), rtol=2**-7, atol=1e-6)
    assert torch.all(out[0, 1, cols // 2 + 1 :] == 0)


@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1, 12, 64), (64, 12, 64), (37, 5, 128)])
def test_rope_equals_the_eager_chain_bit_for_bit(tokens: int, heads: int, dim: int) -> None:
    torch.manual_seed(tokens)
    qkv = (torch.randn(tokens, heads * dim + 3 * dim) * 3).to(BF16)  # q and k heads: a view
    x = qkv[:, : heads * dim].view(tokens, heads, dim)
    angles = torch.rand(tokens, 1, dim) * 6.3
    cos, sin = angles.cos().to(BF16), angles.sin().to(BF16)
    out = KERNELS.rope(x, cos, sin)
    assert out.is_contiguous()
    assert torch.equal(out, apply_rope(x, cos, sin))


@pytest.mark.parametrize(("rows", "width"), [(1, 1536), (64, 1536), (3, 100)])  # 100: a tail
def test_silu_and_mul_equals_the_eager_chain_bit_for_bit(rows: int, width: int) -> None:
    torch.manual_seed(width)
    gate_up = (torch.randn(rows, 2 * width) * 6).to(BF16)
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # exp's clamp, both signs, zeros
    assert torch.equal(KERNELS.silu_and_mul(gate_up), silu_and_mul(gate_up))


@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS])
@pytest.mark.parametrize(("in_features", "with_extras"), [(576, True), (100, False)])  # a tail
def test_few_rows_times_a_weight_is_the_rounded_fp32_product(
    rows: int, in_features: int, with_extras: bool
) -> None:
    assert KERNELS is not None
    generator = torch.Generator().manual_seed(rows + in_features)
    weight = torch.randn(300, in_features, generator=generator).to(BF16)
    wide_x = torch.randn(rows, in_features + 7, generator=generator).to(BF16)
    x = wide_x[:, :in_features]  # rows with a stride past their width
    bias = torch.randn(300, generator=generator).to(BF16) if with_extras else None
    residual = torch.randn(rows, 300, generator=generator).to(BF16) if with_extras else None
    got = KERNELS.linear_few_rows(x, weight, bias, residual)
    expected = x.double() @ weight.double().T
    if with_extras:
        expected += bias.double() + residual.double()
    assert got is not None and got.dtype == BF16
    # the sum is fp32 in another order than float64's: at most one bf16 step apart
    torch.testing.assert_close(got.double(), expected, rtol=2**-7, atol=1e-3)
    assert (got.double() == expected.to(BF16).double()).float().mean() > 0.95


def test_more_rows_than_the_kernel_takes_are_left_to_the_caller() -> None:
    assert KERNELS is not None
    weight = torch.ones(4, 16, dtype=BF16)
    assert KERNELS.linear_few_rows(torch.ones(FEW_ROWS + 1, 16, dtype=BF16), weight) is None

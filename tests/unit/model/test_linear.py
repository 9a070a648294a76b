"""Linear layers: the oneDNN-packed bf16 path against F.linear, and when it is chosen."""

import pytest
import torch
import torch.nn.functional as F

from tieredkv.model.linear import PackedLinear, PlainLinear, make_linear, packed_linear_works

needs_packed = pytest.mark.skipif(
    not packed_linear_works(torch.bfloat16, torch.device("cpu")),
    reason="oneDNN does not run bf16 on this CPU",
)


def test_packed_is_chosen_only_for_bf16_on_cpu() -> None:
    assert not packed_linear_works(torch.float32, torch.device("cpu"))
    assert not packed_linear_works(torch.bfloat16, torch.device("meta"))
    assert isinstance(make_linear(torch.ones(2, 3)), PlainLinear)


@needs_packed
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(rows: int, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).bfloat16()
    bias = torch.randn(96, generator=generator).bfloat16() if with_bias else None
    x = torch.randn(rows, 64, generator=generator).bfloat16()
    residual = torch.randn(rows, 96, generator=generator).bfloat16()
    packed = PackedLinear(weight, bias)
    expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    # bf16 outputs: a few units in the last place of values of size ~10
    torch.testing.assert_close(packed(x).float(), expected, rtol=2e-2, atol=0.1)
    torch.testing.assert_close(
        packed.add_to(residual, x).float(), residual.float() + expected, rtol=2e-2, atol=0.15
    )
    plain = PlainLinear(weight, bias)
    torch.testing.assert_close(packed(x).float(), plain(x).float(), rtol=2e-2, atol=0.1)

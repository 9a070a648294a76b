"""Linear layers: the oneDNN-packed and widened bf16 paths against F.linear, and when each is
chosen."""

import pytest
import torch
import torch.nn.functional as F

from tieredkv.model import linear
from tieredkv.model.cpu_kernels import (
    FEW_ROWS,
    CpuKernels,
    load_cpu_kernels,
    pair_weight,
)
from tieredkv.model.linear import (
    PackedLinear,
    PlainLinear,
    WidenedLinear,
    make_linear,
    packed_linear_works,
)

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


class CountedKernels:
    """The C kernels, counting the products they computed."""

    def __init__(self, inner: CpuKernels | None) -> None:
        self.inner, self.calls = inner, 0

    def linear_few_rows(self, *args: torch.Tensor | None) -> torch.Tensor | None:
        out = None if self.inner is None else self.inner.linear_few_rows(*args)
        self.calls += out is not None
        return out


@needs_packed
@pytest.mark.parametrize("rows", [1, 2, FEW_ROWS, FEW_ROWS + 1, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_widened_linear_rounds_an_fp32_product_of_the_bf16_values(
    rows: int, with_bias: bool
) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).bfloat16()
    bias = torch.randn(96, generator=generator).bfloat16() if with_bias else None
    x = torch.randn(rows, 64, generator=generator).bfloat16()
    residual = torch.randn(rows, 96, generator=generator).bfloat16()
    kernels = CountedKernels(load_cpu_kernels())
    widened = WidenedLinear(weight, bias, kernels)  # type: ignore[arg-type]
    expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    with_residual = residual.float() + expected
    got, summed = widened(x), widened.add_to(residual, x)
    assert got.dtype == summed.dtype == torch.bfloat16
    if rows == 1:  # the packed bf16 weight: oneDNN's rounding
        torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=0.1)
        torch.testing.assert_close(summed.float(), with_residual, rtol=2e-2, atol=0.15)
    elif rows <= FEW_ROWS and kernels.inner is not None:  # the C product: another sum order
        torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-3)
        torch.testing.assert_close(summed.float(), with_residual, rtol=2**-7, atol=1e-3)
    else:  # fp32 products and sums in torch, one rounding at the end
        assert torch.equal(got, expected.bfloat16())
        assert torch.equal(summed, with_residual.bfloat16())
    took_c = 1 < rows <= FEW_ROWS and kernels.inner is not None
    assert kernels.calls == (2 if took_c else 0)


@needs_packed
@pytest.mark.parametrize("emulated", [False, True])
def test_a_cpu_that_emulates_bf16_gets_widened_linears(monkeypatch, emulated: bool) -> None:
    monkeypatch.setattr(linear, "bf16_is_emulated", lambda device: emulated)
    weight = torch.ones(8, 4, dtype=torch.bfloat16)
    assert isinstance(make_linear(weight, packed=True), WidenedLinear if emulated else PackedLinear)
    assert isinstance(make_linear(weight, packed=False), PlainLinear)


paired_kernels = linear._paired_kernels()
needs_paired = pytest.mark.skipif(
    paired_kernels is None, reason="needs AVX512-BF16 without AMX and gcc for the C kernels"
)


@needs_paired
@pytest.mark.parametrize("rows", [1, 3, 8, 11, 16, 17, 40, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_paired_linear_rounds_the_fp32_product_once(rows: int, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).bfloat16()
    bias = torch.randn(96, generator=generator).bfloat16() if with_bias else None
    x = torch.randn(rows, 64, generator=generator).bfloat16()
    residual = torch.randn(rows, 96, generator=generator).bfloat16()
    packed = PackedLinear(weight, bias, kernels=paired_kernels)
    expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    got, summed = packed(x), packed.add_to(residual, x)
    assert got.dtype == summed.dtype == torch.bfloat16
    # fp32 sums in another order than F.linear's: a bf16 step at most, for any row count
    torch.testing.assert_close(got, expected.bfloat16(), rtol=8e-3, atol=1e-2)
    torch.testing.assert_close(summed, (expected + residual.float()).bfloat16(),
                               rtol=8e-3, atol=1e-2)  # fmt: skip


@needs_paired
def test_paired_linear_gives_each_row_what_it_gives_it_alone() -> None:
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(48, 576, generator=generator).bfloat16()
    x = torch.randn(37, 576, generator=generator).bfloat16()  # decode-sized and beyond
    packed = PackedLinear(weight, kernels=paired_kernels)
    together = packed(x)
    for row in range(x.shape[0]):
        assert torch.equal(packed(x[row : row + 1]), together[row : row + 1])


@needs_paired
def test_paired_linear_leaves_shapes_it_cannot_lay_out_to_onednn() -> None:
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(40, 64, generator=generator).bfloat16()  # 40 outputs: not blocks of 16
    x = torch.randn(2, 64, generator=generator).bfloat16()
    packed = PackedLinear(weight, kernels=paired_kernels)
    assert pair_weight(weight) is None
    expected = F.linear(x.float(), weight.float())
    torch.testing.assert_close(packed(x).float(), expected, rtol=2e-2, atol=0.1)


@needs_paired
def test_paired_linear_holds_one_copy_and_gives_the_weights_rows() -> None:
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(64, 96, generator=generator).bfloat16()
    packed = PackedLinear(weight, kernels=paired_kernels)
    held = [value for value in vars(packed).values() if isinstance(value, torch.Tensor)]
    assert sum(t.numel() for t in held) == weight.numel()  # no oneDNN copy beside the pairs
    ids = torch.tensor([0, 15, 16, 63, 15])
    assert packed.gives_rows and torch.equal(packed.weight_rows(ids), weight[ids])


@needs_paired
def test_paired_linear_reads_rows_it_cannot_take_in_place() -> None:
    generator = torch.Generator().manual_seed(8)
    weight = torch.randn(32, 64, generator=generator).bfloat16()
    packed = PackedLinear(weight, kernels=paired_kernels)
    wide = torch.randn(5, 65, generator=generator).bfloat16()
    x = wide[:, 1:]  # rows 2-byte aligned, odd row stride: the kernel refuses them in place
    residual = torch.randn(5, 32, generator=generator).bfloat16()
    torch.testing.assert_close(packed.add_to(residual, x), packed.add_to(residual, x.clone()),
                               rtol=0, atol=0)  # fmt: skip

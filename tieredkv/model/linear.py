"""Linear layers: `y = x @ W.T (+ b)`, through the fastest path for the weights' device and dtype.

`F.linear` on a bf16 CPU tensor hands oneDNN a plain weight that it re-lays-out on every call;
for decode-shaped inputs (a few rows) that costs more than the product itself. On a CPU whose
oneDNN runs bf16 (AMX or AVX512-BF16), `PackedLinear` lays each weight out once, at load, in
oneDNN's blocked format and calls oneDNN directly; it also fuses a residual add into the product.
On a CPU with AVX512-BF16 but without AMX, its products run in C instead
(`cpu_kernels.linear_paired`) on one copy of the weight: oneDNN's overhead per call and its
single-row kernel took twice the time of the C loop for decode steps, which stream the weight
once at memory speed; for prefill chunks the C loop runs within a few percent of oneDNN's
many-row packing, which would be a second copy of every weight.
On a CPU that only emulates bf16 (neither AMX nor AVX512-BF16), `WidenedLinear` multiplies a
few rows in C and many in fp32, on an fp32 copy of the weight. Everything else (CUDA, fp32, a torch
without oneDNN) uses `PlainLinear`. fp32 stays on `F.linear` on purpose: its outputs must match
transformers' token for token.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from tieredkv.model.cpu_kernels import CpuKernels, load_cpu_kernels, pair_weight
from tieredkv.model.dtype import bf16_is_emulated, cpu_flags

log = logging.getLogger(__name__)

_DECODE_ROWS = 16  # up to this many rows use the packing oneDNN picks for one row


class PlainLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight  # (out, in)
        self.bias = bias  # (out,) or None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x)."""
        return residual + F.linear(x, self.weight, self.bias)


class PackedLinear:
    """A bf16 CPU weight laid out once for the fastest product here, and held only that way.

    With `kernels` (a CPU with AVX512-BF16, no AMX) the layout is `pair_weight`'s and every
    product runs in `CpuKernels.linear_paired`, whatever the row count: one copy of the weight
    serves decode and prefill. Otherwise (or for a shape `pair_weight` does not cover) the
    weight is in oneDNN's blocked layout, packed twice: for a few rows and for many rows (one
    packing loses up to 3x on the other's shapes)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        many_rows: bool = True,
        kernels: CpuKernels | None = None,
    ) -> None:
        self.bias = bias
        self._paired = pair_weight(weight) if kernels is not None and many_rows else None
        self._kernels = kernels if self._paired is not None else None
        if self._paired is None:
            reorder = torch.ops.mkldnn._reorder_linear_weight
            self._few = reorder(weight, 1)
            self._many = reorder(weight, 2048) if many_rows else self._few

    @property
    def gives_rows(self) -> bool:
        """Whether `weight_rows` can read the weight's rows: the paired layout, not oneDNN's."""
        return self._paired is not None

    def weight_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (T,) of the weight as given: (T, in), gathered from the paired layout."""
        assert self._paired is not None, "oneDNN's layout gives no rows: check gives_rows"
        rows = self._paired[ids // 16, :, ids % 16, :]  # (T, in / 2, 2)
        return rows.reshape(ids.shape[0], -1)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return self._few if x.shape[0] <= _DECODE_ROWS else self._many

    def _paired_product(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        assert self._kernels is not None and self._paired is not None
        if (out := self._kernels.linear_paired(x, self._paired, self.bias, residual)) is not None:
            return out
        # a row the kernel cannot read in place (unaligned or strided): fresh, aligned copies
        x = x.clone(memory_format=torch.contiguous_format)
        residual = None if residual is None else residual.contiguous()
        out = self._kernels.linear_paired(x, self._paired, self.bias, residual)
        assert out is not None, f"linear_paired refused contiguous rows {tuple(x.shape)}"
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernels is not None:
            return self._paired_product(x, None)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed(x), self.bias, "none", [], "")

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x), the add fused into the product."""
        if self._kernels is not None:
            return self._paired_product(x, residual)
        if self.bias is not None:
            return residual + self(x)
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self._packed(x), None, "add")


class WidenedLinear:
    """A bf16 weight on a CPU that emulates bf16. One row (a decode step) stays on the packed
    bf16 weight; up to `FEW_ROWS` rows (a batch of decodes) go to `cpu_kernels`' product, which
    reads each bf16 weight row once for all of them; more rows are multiplied in fp32 on an
    fp32 copy of the weight, holding exactly its bf16 values. Every path sums in fp32 and
    rounds once to bf16, which is what a bf16 matmul computes. Without bf16 instructions oneDNN
    emulates the packed bf16 product slowly for many rows, the C product reads each weight row
    once for a few rows, and a single row is cheapest packed."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        kernels: CpuKernels | None = None,
    ) -> None:
        self._one_row = PackedLinear(weight, bias, many_rows=False)
        self._kernels = kernels
        self._bf16_weight, self._bf16_bias = weight.contiguous(), bias
        self.weight = weight.float()
        self.bias = None if bias is None else bias.float()

    def _few_rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor | None:
        if self._kernels is None or x.stride(1) != 1:
            return None
        if residual is not None and not residual.is_contiguous():
            return None
        return self._kernels.linear_few_rows(x, self._bf16_weight, self._bf16_bias, residual)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self._one_row(x)
        if (few := self._few_rows(x, None)) is not None:
            return few
        return F.linear(x.float(), self.weight, self.bias).to(x.dtype)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + self(x), added in fp32 and rounded once."""
        if x.shape[0] == 1:
            return self._one_row.add_to(residual, x)
        if (few := self._few_rows(x, residual)) is not None:
            return few
        wide = F.linear(x.float(), self.weight, self.bias)
        return wide.add_(residual).to(residual.dtype)


Linear = PlainLinear | PackedLinear | WidenedLinear


def packed_linear_works(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `PackedLinear` runs here and agrees with `F.linear` on a small product."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return False
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 64, generator=generator).to(dtype)
        x = torch.randn(3, 64, generator=generator).to(dtype)
        got = PackedLinear(weight)(x).float()
    except (RuntimeError, AttributeError) as error:  # an op missing from this torch build
        log.info("oneDNN packed linear unavailable (%s); using F.linear", error)
        return False
    expected = F.linear(x.float(), weight.float())
    return bool(torch.allclose(got, expected, rtol=2e-2, atol=0.1))


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, packed: bool = False
) -> Linear:
    """`packed`: what `packed_linear_works` said for the weight's dtype and device."""
    if not packed:
        return PlainLinear(weight, bias)
    if bf16_is_emulated(weight.device):
        return WidenedLinear(weight, bias, load_cpu_kernels())
    return PackedLinear(weight, bias, kernels=_paired_kernels())


def _paired_kernels() -> CpuKernels | None:
    """The C kernels where their few-row product beats oneDNN's: AVX512-BF16 without AMX."""
    flags = cpu_flags()
    if "amx_bf16" in flags or "avx512_bf16" not in flags:
        return None
    return load_cpu_kernels()

"""The elementwise ops: fused (inductor) equal eager within bf16 rounding; eager where asked."""

import pytest
import torch

from tieredkv.model import pointwise
from tieredkv.model.cpu_kernels import load_cpu_kernels
from tieredkv.model.dtype import cpu_flags
from tieredkv.model.pointwise import FUSED_MIN_TOKENS, FusedPointwise, Pointwise, make_pointwise
from tieredkv.model.rope import apply_rope
from tieredkv.model_config import ModelConfig

CONFIG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=512,
)  # fmt: skip


def test_fp32_and_other_devices_stay_eager() -> None:
    assert type(make_pointwise(CONFIG, torch.float32, torch.device("cpu"))) is Pointwise
    assert type(make_pointwise(CONFIG, torch.bfloat16, torch.device("meta"))) is Pointwise


def test_a_compiler_failure_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(pointwise, "FusedPointwise", broken)
    assert type(make_pointwise(CONFIG, torch.bfloat16, torch.device("cpu"))) is Pointwise


def test_fused_ops_equal_eager_in_bf16() -> None:
    fused = make_pointwise(CONFIG, torch.bfloat16, torch.device("cpu"))
    assert isinstance(fused, FusedPointwise)
    eager = Pointwise()
    short = fused.for_tokens(FUSED_MIN_TOKENS - 1)  # decode: eager ops, in C if built
    kernels = load_cpu_kernels()
    in_c = kernels is not None and "amx_bf16" not in cpu_flags()
    assert short.rms_norm == (kernels.rms_norm if in_c else pointwise.rms_norm)
    assert short.rope == (kernels.rope if in_c else apply_rope)
    assert short.silu_and_mul == (kernels.silu_and_mul if in_c else pointwise.silu_and_mul)
    generator = torch.Generator().manual_seed(0)
    tokens = 300
    x = torch.randn(tokens, 32, generator=generator).bfloat16()
    weight = torch.randn(32, generator=generator).bfloat16()
    ops = fused.for_tokens(tokens)
    torch.testing.assert_close(
        ops.rms_norm(x, weight, 1e-5).float(), eager.rms_norm(x, weight, 1e-5).float(),
        rtol=2e-2, atol=2e-2,
    )  # fmt: skip
    qk = torch.randn(tokens, 6, 8, generator=generator).bfloat16()
    cos = torch.randn(tokens, 1, 8, generator=generator).bfloat16()
    sin = torch.randn(tokens, 1, 8, generator=generator).bfloat16()
    torch.testing.assert_close(
        ops.rope(qk, cos, sin).float(), apply_rope(qk, cos, sin).float(), rtol=2e-2, atol=5e-2
    )
    gate_up = torch.randn(tokens, 96, generator=generator).bfloat16()
    torch.testing.assert_close(
        ops.silu_and_mul(gate_up).float(), eager.silu_and_mul(gate_up).float(),
        rtol=2e-2, atol=2e-2,
    )  # fmt: skip

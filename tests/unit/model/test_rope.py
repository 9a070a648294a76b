"""RoPE tables and rotation against transformers' own implementation (to 1e-6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from tests.model_factory import make_tiny_model_dir
from tieredkv.model.hf_config import parse_model_config
from tieredkv.model.loader import load_model
from tieredkv.model.rope import apply_rope, build_rope_cache, rope_inv_freq
from tieredkv.model_config import ModelConfig, RopeScaling

MAX_LEN = 4096
VARIANTS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 2048,
        "attention_factor": 0.8,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
    },
}


def _hf_config(scaling: dict[str, Any] | None, head_dim: int = 64) -> LlamaConfig:
    rope = {"rope_type": "default", **(scaling or {}), "rope_theta": 500000.0}
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=MAX_LEN,
        rope_parameters=rope,
        vocab_size=32,
        num_hidden_layers=1,
        intermediate_size=32,
    )


def _ours(hf: LlamaConfig) -> ModelConfig:
    return parse_model_config(hf.to_dict(), Path("config.json"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tables_match_transformers_rotary_embedding(variant: str) -> None:
    hf = _hf_config(VARIANTS[variant])
    positions = torch.arange(MAX_LEN)[None, :]  # (1, MAX_LEN)
    x = torch.zeros(1, MAX_LEN, 64)
    ref_cos, ref_sin = LlamaRotaryEmbedding(hf)(x, positions)  # (1, MAX_LEN, head_dim)
    cos, sin = build_rope_cache(_ours(hf), MAX_LEN, "cpu")
    assert cos.shape == (MAX_LEN, 64) and cos.dtype == torch.float32
    torch.testing.assert_close(cos, ref_cos[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, ref_sin[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "default"])
def test_inv_freq_and_scale_match_rope_init_functions(variant: str) -> None:
    hf = _hf_config(VARIANTS[variant])
    ref_inv_freq, ref_scale = ROPE_INIT_FUNCTIONS[hf.rope_parameters["rope_type"]](hf, "cpu")
    inv_freq, scale = rope_inv_freq(_ours(hf))
    torch.testing.assert_close(inv_freq, ref_inv_freq.float(), atol=0, rtol=1e-7)
    assert scale == pytest.approx(ref_scale, rel=1e-12)
    if variant != "linear":  # the variant really changes something at these settings
        assert not torch.equal(inv_freq, rope_inv_freq(_ours(_hf_config(None)))[0])


def test_yarn_scale_is_folded_into_the_tables() -> None:
    hf = _hf_config(VARIANTS["yarn"])
    cos, sin = build_rope_cache(_ours(hf), 8, "cpu")
    expected_scale = 0.1 * torch.log(torch.tensor(4.0)).item() + 1.0
    assert cos[0].tolist() == pytest.approx([expected_scale] * 64)  # cos(0) * scale
    assert sin[0].abs().max().item() == 0.0


def test_apply_rope_matches_transformers() -> None:
    config = _ours(_hf_config(VARIANTS["llama3"], head_dim=32))
    cos, sin = build_rope_cache(config, 64, "cpu")
    positions = torch.tensor([0, 5, 17, 63, 1])
    q = torch.randn(5, 4, 32)  # (num_tokens, heads, head_dim)
    k = torch.randn(5, 2, 32)
    ref_q, ref_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[positions][None], sin[positions][None]
    )  # (1, heads, num_tokens, head_dim)
    torch.testing.assert_close(
        apply_rope(q, cos[positions], sin[positions]), ref_q[0].transpose(0, 1)
    )
    torch.testing.assert_close(
        apply_rope(k, cos[positions], sin[positions]), ref_k[0].transpose(0, 1)
    )


def test_apply_rope_keeps_dtype_and_position_zero_is_identity() -> None:
    config = ModelConfig(32, 64, 128, 1, 4, 2, 16)
    cos, sin = build_rope_cache(config, 4, "cpu")
    x = torch.randn(1, 4, 16, dtype=torch.bfloat16)
    out = apply_rope(x, cos[:1], sin[:1])
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, x)


def test_hand_built_config_defaults_original_length_to_max_positions() -> None:
    """RopeScaling() built by hand (original length 0) behaves like transformers' default."""
    scaling = RopeScaling(kind="yarn", factor=4.0)
    config = ModelConfig(32, 256, 32, 1, 4, 2, 64, rope_theta=500000.0, rope_scaling=scaling)
    config = ModelConfig(**{**config.__dict__, "max_position_embeddings": MAX_LEN})
    hf = _hf_config({"rope_type": "yarn", "factor": 4.0})  # original = max_position_embeddings
    ref_inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    torch.testing.assert_close(rope_inv_freq(config)[0], ref_inv_freq.float(), atol=0, rtol=1e-7)


def test_loaded_tiny_yarn_model_matches_its_transformers_rotary_embedding(tmp_path: Path) -> None:
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    model_dir = make_tiny_model_dir(tmp_path, "qwen2", rope_scaling=scaling)
    config = load_model(model_dir).config
    assert config.rope_scaling.kind == "yarn"
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    positions = torch.arange(512)[None, :]
    ref_cos, _ = LlamaRotaryEmbedding(hf)(torch.zeros(1, 512, 16), positions)
    cos, _ = build_rope_cache(config, 512, "cpu")
    torch.testing.assert_close(cos, ref_cos[0], atol=1e-6, rtol=0)

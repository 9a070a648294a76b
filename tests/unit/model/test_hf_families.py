"""Qwen3 and Gemma 3 config parsing (windows per layer, both spellings of Gemma's fields), and
the start-up refusals: each one line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tieredkv.errors import ModelLoadError, UnsupportedModelError
from tieredkv.model.gguf_file import check_gguf
from tieredkv.model.hf_config import parse_model_config

SOURCE = Path("/models/x/config.json")
COMMON = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def qwen3(**overrides: Any) -> dict[str, Any]:
    return {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **COMMON, **overrides}


def gemma3(**overrides: Any) -> dict[str, Any]:
    raw = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **COMMON}
    return {**raw, **overrides}


def test_qwen3_defaults_are_transformers_defaults() -> None:
    config = parse_model_config(qwen3(), SOURCE)
    assert config.architecture == "qwen3" and not config.attention_bias
    assert config.head_dim == 128 and config.rms_norm_eps == 1e-6  # Qwen3Config's defaults
    assert config.layer_windows == () and not config.tie_word_embeddings
    assert parse_model_config(qwen3(head_dim=32), SOURCE).head_dim == 32


@pytest.mark.parametrize(
    ("fields", "windows"),
    [
        ({"sliding_window": 256}, ()),  # use_sliding_window defaults to false
        ({"use_sliding_window": True, "sliding_window": None}, ()),
        (
            {"use_sliding_window": True, "sliding_window": 256, "max_window_layers": 2},
            (None,) * 2 + (256,) * 2,
        ),
        ({"use_sliding_window": True, "sliding_window": 256}, (None,) * 4),  # max_window_layers 28
        (
            {
                "use_sliding_window": True,
                "sliding_window": 256,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
            },
            (256, None, 256, None),
        ),
        ({"use_sliding_window": False, "layer_types": ["sliding_attention"] * 4}, ()),
        ({"use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 0}, ()),
    ],
)
def test_qwen3_windows_as_transformers_reads_them(fields: dict[str, Any], windows: tuple) -> None:
    assert parse_model_config(qwen3(**fields), SOURCE).layer_windows == windows


def test_gemma3_fields_in_the_transformers_5_spelling() -> None:
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    layer_types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    raw = gemma3(
        head_dim=32,
        rope_parameters=rope,
        layer_types=layer_types,
        sliding_window=512,
        query_pre_attn_scalar=24,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
    )
    config = parse_model_config(raw, SOURCE)
    assert config.layer_windows == (512, 512, 512, None) and config.has_sliding_layers
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert (config.rope_scaling.kind, config.rope_scaling.factor) == ("linear", 8.0)
    assert config.attention_scale == 24**-0.5 and config.final_logit_softcapping == 30.0
    assert config.tie_word_embeddings and config.rms_norm_eps == 1e-6


def test_gemma3_fields_in_the_older_spelling_and_defaults() -> None:
    raw = gemma3(
        rope_theta=1_000_000.0,
        rope_local_base_freq=20_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window_pattern=2,
        sliding_window=256,
    )
    config = parse_model_config(raw, SOURCE)
    assert config.layer_windows == (256, None, 256, None)  # every second layer global
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 20_000.0)
    assert config.rope_scaling.factor == 8.0
    # transformers' defaults: head_dim 256, query_pre_attn_scalar 256, a global layer in 6
    config = parse_model_config(gemma3(num_hidden_layers=7), SOURCE)
    assert config.head_dim == 256 and config.query_pre_attn_scalar == 256
    assert config.layer_windows == (4096,) * 5 + (None, 4096)
    assert config.rope_local_theta == 10_000.0 and config.final_logit_softcapping is None
    assert config.rope_theta == 1_000_000.0 and config.tie_word_embeddings


def refusal(raw: dict[str, Any], error: type[Exception] = UnsupportedModelError) -> str:
    with pytest.raises(error) as info:
        parse_model_config(raw, SOURCE)
    message = str(info.value)
    assert message.startswith(f"{SOURCE}: ") and "\n" not in message
    return message


def test_multimodal_gemma3_is_refused_naming_the_field() -> None:
    multimodal = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": gemma3(),
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    message = refusal(multimodal)
    assert "model_type='gemma3'" in message and "gemma3_text" in message
    assert "vision_config" in refusal({**qwen3(), "vision_config": {}})


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]}, "model_type='jamba'"),
        ({"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"]}, "'falcon_h1'"),
        ({"model_type": "qwen3_next"}, "linear-attention"),
        (qwen3(layer_types=["full_attention", "mamba"] * 2), "layer_types entry 'mamba' (layer 1)"),
        (
            qwen3(layer_types=["linear_attention"] * 4),
            "entry 'linear_attention' (layer 0)",
        ),
        (qwen3(layers_block_type=["attention", "mamba"]), "layers_block_type"),
        (qwen3(hybrid_override_pattern="M-M*"), "hybrid_override_pattern"),
    ],
)
def test_layers_that_are_not_attention_are_refused(raw: dict[str, Any], fragment: str) -> None:
    message = refusal(raw)
    assert fragment in message


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_length_dependent_rope_is_refused_naming_the_field(kind: str) -> None:
    message = refusal(qwen3(rope_scaling={"rope_type": kind, "factor": 2.0}))
    assert f"rope_scaling: rope scaling '{kind}' depends on the sequence length" in message
    nested = {"full_attention": {"rope_type": kind, "factor": 2.0}, "sliding_attention": {}}
    message = refusal(gemma3(rope_parameters=nested))
    assert f"rope_parameters.full_attention: rope scaling '{kind}'" in message


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
            "rope_parameters.sliding_attention.rope_type='linear'",
        ),
    ],
)
def test_gemma3_options_the_forward_pass_lacks_are_refused(
    fields: dict[str, Any], fragment: str
) -> None:
    assert fragment in refusal(gemma3(**fields))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (gemma3(layer_types=["full_attention"]), "layer_types must list one entry per layer"),
        (gemma3(sliding_window=0), "'sliding_window' must be an integer >= 1"),
        (gemma3(sliding_window=None), "'sliding_window' must be an integer >= 1, got None"),
        (gemma3(query_pre_attn_scalar=None), "'query_pre_attn_scalar' must be a positive"),
        (gemma3(final_logit_softcapping="30"), "'final_logit_softcapping' must be a positive"),
        (gemma3(sliding_window_pattern="6"), "'sliding_window_pattern'"),
        (qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=-1), "max_window"),
    ],
)
def test_malformed_family_fields_are_load_errors(raw: dict[str, Any], fragment: str) -> None:
    assert fragment in refusal(raw, ModelLoadError)


def _gguf_of(path: Path, architecture: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_reads_qwen3_and_refuses_gemma3(tmp_path: Path) -> None:
    check_gguf(_gguf_of(tmp_path / "q.gguf", "qwen3"))  # no error: transformers converts it
    with pytest.raises(UnsupportedModelError) as info:
        check_gguf(_gguf_of(tmp_path / "g.gguf", "gemma3"))
    assert "unsupported GGUF architecture 'gemma3'" in str(info.value)
    assert "safetensors directory" in str(info.value)

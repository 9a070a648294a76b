"""config.json parsing: both RoPE spellings, and every refusal with its message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tieredkv.errors import ModelLoadError, UnsupportedModelError
from tieredkv.model.hf_config import parse_model_config, read_config_json

SOURCE = Path("/models/x/config.json")


def _llama(**overrides: Any) -> dict[str, Any]:
    raw = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0,
    }
    return {**raw, **overrides}


def test_llama_fields_and_defaults() -> None:
    config = parse_model_config(_llama(), SOURCE)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (128, 64, 96)
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (2, 4, 2)
    assert config.head_dim == 16  # hidden_size // num_attention_heads when absent
    assert config.rope_theta == 500000.0 and config.rope_scaling.kind == "default"
    assert config.rms_norm_eps == 1e-6
    assert not config.tie_word_embeddings and not config.attention_bias
    assert config.architecture == "llama"


def test_explicit_head_dim_and_missing_kv_heads() -> None:
    raw = _llama(head_dim=32)
    del raw["num_key_value_heads"]
    config = parse_model_config(raw, SOURCE)
    assert config.head_dim == 32 and config.num_kv_heads == 4


def test_qwen2_has_qkv_bias_and_mistral_parses() -> None:
    qwen = parse_model_config(
        _llama(model_type="qwen2", architectures=["Qwen2ForCausalLM"]), SOURCE
    )
    assert qwen.attention_bias and qwen.architecture == "qwen2"
    mistral = parse_model_config(
        _llama(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None),
        SOURCE,
    )
    assert mistral.architecture == "mistral" and not mistral.attention_bias


@pytest.mark.parametrize(
    "raw_rope",
    [
        {"rope_scaling": {"type": "linear", "factor": 2.0}},  # old spelling, "type"
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}},
    ],
)
def test_rope_spellings(raw_rope: dict[str, Any]) -> None:
    config = parse_model_config(_llama(**raw_rope), SOURCE)
    assert config.rope_scaling.kind == "linear" and config.rope_scaling.factor == 2.0
    assert config.rope_theta == 500000.0


def test_llama3_and_yarn_parameters() -> None:
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 2.0,
        "high_freq_factor": 8.0,
        "original_max_position_embeddings": 256,
    }
    scaling = parse_model_config(_llama(rope_scaling=llama3), SOURCE).rope_scaling
    assert (scaling.kind, scaling.factor, scaling.low_freq_factor) == ("llama3", 8.0, 2.0)
    assert (scaling.high_freq_factor, scaling.original_max_position_embeddings) == (8.0, 256)
    yarn = parse_model_config(_llama(rope_scaling={"type": "yarn", "factor": 4.0}), SOURCE)
    assert yarn.rope_scaling.original_max_position_embeddings == 1024  # max positions
    assert yarn.rope_scaling.attention_factor == pytest.approx(0.1 * 1.3862943611198906 + 1)


def _assert_refused(raw: dict[str, Any], error: type[Exception], *fragments: str) -> None:
    with pytest.raises(error) as info:
        parse_model_config(raw, SOURCE)
    for fragment in (str(SOURCE), *fragments):
        assert fragment in str(info.value)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_length_dependent_rope_is_refused(kind: str) -> None:
    raw = _llama(rope_scaling={"rope_type": kind, "factor": 2.0})
    _assert_refused(raw, UnsupportedModelError, f"rope scaling '{kind}'", "sequence length")


def test_unsupported_architectures() -> None:
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64}
    _assert_refused(gpt2, UnsupportedModelError, "unsupported architecture", "'gpt2'")
    mixtral = _llama(model_type="mixtral", architectures=["MixtralForCausalLM"])
    _assert_refused(mixtral, UnsupportedModelError, "unsupported architecture", "Mixtral")
    mislabelled = _llama(architectures=["MixtralForCausalLM"])
    _assert_refused(mislabelled, UnsupportedModelError, "MixtralForCausalLM")


def test_other_refusals() -> None:
    _assert_refused(_llama(hidden_act="gelu"), UnsupportedModelError, "hidden_act 'gelu'")
    _assert_refused(_llama(mlp_bias=True), UnsupportedModelError, "mlp_bias")
    _assert_refused(_llama(attention_bias=True), UnsupportedModelError, "o_proj bias")
    _assert_refused(
        _llama(quantization_config={"quant_method": "awq"}), UnsupportedModelError, "awq"
    )
    _assert_refused(_llama(partial_rotary_factor=0.5), UnsupportedModelError, "partial_rotary")
    _assert_refused(_llama(vocab_size="big"), ModelLoadError, "'vocab_size'", "'big'")
    _assert_refused(_llama(num_key_value_heads=3), ModelLoadError, "multiple of")


def test_read_config_json_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json not found"):
        read_config_json(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a valid JSON file"):
        read_config_json(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ModelLoadError, match="expected a JSON object"):
        read_config_json(tmp_path)

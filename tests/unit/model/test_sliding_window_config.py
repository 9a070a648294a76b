"""Mistral and Qwen2 sliding windows parse into `layer_windows` exactly as transformers applies
them: its own config classes decide, for the same config.json, which layers slide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers

from tieredkv.errors import ModelLoadError, UnsupportedModelError
from tieredkv.model.hf_config import parse_model_config

SOURCE = Path("/models/x/config.json")
LAYERS = 4


def _raw(model_type: str, **overrides: Any) -> dict[str, Any]:
    architecture = {"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    raw = {
        "model_type": model_type,
        "architectures": [architecture],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
    }
    return {**raw, **overrides}


def _transformers_windows(raw: dict[str, Any]) -> tuple[int | None, ...]:
    """Per layer, the window transformers' attention uses for this config.json."""
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures")}
    if raw["model_type"] == "mistral":
        config = transformers.MistralConfig(**fields)
        return tuple(config.sliding_window for _ in range(LAYERS))  # every layer, or none
    config = transformers.Qwen2Config(**fields)
    return tuple(
        config.sliding_window if kind == "sliding_attention" else None
        for kind in config.layer_types
    )


CASES = [
    _raw("mistral"),  # no field: transformers' 4096
    _raw("mistral", sliding_window=None),
    _raw("mistral", sliding_window=32),
    _raw("qwen2", sliding_window=32),  # use_sliding_window absent: off
    _raw("qwen2", sliding_window=32, use_sliding_window=False, max_window_layers=1),
    _raw("qwen2", sliding_window=32, use_sliding_window=True, max_window_layers=1),
    _raw("qwen2", sliding_window=48, use_sliding_window=True, max_window_layers=0),
    _raw("qwen2", use_sliding_window=True, max_window_layers=3),  # default window 4096
    _raw("qwen2", use_sliding_window=True),  # max_window_layers 28 > 4 layers: none slide
    _raw(
        "qwen2",
        sliding_window=32,
        use_sliding_window=True,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
]


@pytest.mark.parametrize("raw", CASES)
def test_layer_windows_are_the_ones_transformers_applies(raw: dict[str, Any]) -> None:
    config = parse_model_config(raw, SOURCE)
    expected = _transformers_windows(raw)
    assert tuple(config.window_of(layer) for layer in range(LAYERS)) == expected
    assert config.has_sliding_layers == any(w is not None for w in expected)


def test_a_window_covering_the_whole_context_leaves_the_layers_full() -> None:
    config = parse_model_config(_raw("mistral", sliding_window=8192), SOURCE)
    assert config.layer_windows == () and not config.has_sliding_layers


def test_llama_ignores_a_sliding_window_field() -> None:
    raw = {**_raw("mistral", sliding_window=32), "model_type": "llama"}
    raw["architectures"] = ["LlamaForCausalLM"]
    assert parse_model_config(raw, SOURCE).layer_windows == ()


@pytest.mark.parametrize(
    ("raw", "error", "match"),
    [
        (_raw("mistral", sliding_window=0), ModelLoadError, "sliding_window must be a positive"),
        (_raw("mistral", sliding_window="32"), ModelLoadError, "sliding_window must be"),
        (
            _raw("qwen2", sliding_window=32, use_sliding_window=True, layer_types=["full"] * 4),
            UnsupportedModelError,
            "layer_types entry 'full'",
        ),
        (
            _raw("qwen2", sliding_window=32, use_sliding_window=True, layer_types=[]),
            ModelLoadError,
            "layer_types must list 4",
        ),
    ],
)
def test_malformed_windows_are_refused_naming_the_field(raw, error, match) -> None:
    with pytest.raises(error, match=match):
        parse_model_config(raw, SOURCE)

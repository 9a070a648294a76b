"""The tiny-model factory other tests rely on: deterministic, consistent, loadable by both."""

from __future__ import annotations

import json
from pathlib import Path

from tests.model_factory import TINY_VOCAB_SIZE, make_tiny_model_dir


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    first = make_tiny_model_dir(tmp_path / "a", "qwen2")
    second = make_tiny_model_dir(tmp_path / "b", "qwen2")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    third = make_tiny_model_dir(tmp_path / "c", "qwen2", seed=1)
    assert (third / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


def test_config_follows_the_arguments(tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    model_dir = make_tiny_model_dir(
        tmp_path,
        "llama",
        tie_word_embeddings=True,
        rope_scaling=scaling,
        num_layers=3,
        hidden_size=96,
        num_heads=6,
        num_kv_heads=3,
    )
    config = json.loads((model_dir / "config.json").read_text())
    assert config["vocab_size"] == TINY_VOCAB_SIZE
    assert (config["num_hidden_layers"], config["hidden_size"]) == (3, 96)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (6, 3)
    assert config["tie_word_embeddings"] is True
    assert config["rope_parameters"]["rope_type"] == "llama3"


def test_default_tokenizer_option(tmp_path: Path, default_dir: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path, tokenizer=default_dir)
    assert (model_dir / "tokenizer.json").read_bytes() == (
        default_dir / "tokenizer.json"
    ).read_bytes()
    assert json.loads((model_dir / "config.json").read_text())["vocab_size"] == 49152

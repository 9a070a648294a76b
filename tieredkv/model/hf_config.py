"""Read a Hugging Face `config.json` into a `ModelConfig`, refusing what we cannot serve exactly.

A page's KV must depend only on its prefix, so anything whose keys/values depend on the
sequence length (dynamic NTK and longrope RoPE) is refused here, before any weight is read;
so are layers that are not attention (`hf_families`). Sliding windows become
`ModelConfig.layer_windows`, layer by layer as transformers applies them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tieredkv.errors import ConfigError, ModelLoadError, UnsupportedModelError
from tieredkv.model.hf_families import gemma3_fields, qwen3_windows, refuse_unsupported_layers
from tieredkv.model_config import ModelConfig, RopeScaling

# model_type -> the architectures entry Hugging Face writes for it.
SUPPORTED_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
# transformers' defaults where a family's differ from Llama's
_DEFAULT_HEAD_DIM = {"qwen3": 128, "gemma3_text": 256}
_DEFAULT_TIED = {"gemma3_text": True}
_DEFAULT_THETA = {"gemma3_text": 1_000_000.0}  # Gemma 3's global layers
_DEFAULT_EPS = {"qwen2": 1e-6, "qwen3": 1e-6, "gemma3_text": 1e-6}


def read_config_json(model_dir: Path) -> dict[str, Any]:
    """The parsed `config.json` of `model_dir`; ModelLoadError if missing or not JSON."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path}: config.json not found; a model directory needs one")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not a valid JSON file ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def parse_model_config(raw: dict[str, Any], source: Path) -> ModelConfig:
    """Build a ModelConfig from a Hugging Face config dict read from `source` (for messages)."""
    refuse_unsupported_layers(raw, source)
    architecture = _check_architecture(raw, source)
    windows = _sliding_windows(raw, architecture, source)
    if architecture != "gemma3_text" and raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"{source}: hidden_act {raw['hidden_act']!r} is not silu")
    if raw.get("mlp_bias"):
        raise UnsupportedModelError(f"{source}: mlp_bias=true is not supported")
    if architecture != "qwen2" and raw.get("attention_bias"):
        raise UnsupportedModelError(f"{source}: attention_bias=true (o_proj bias) is not supported")
    if raw.get("quantization_config"):
        method = raw["quantization_config"].get("quant_method", "?")
        raise UnsupportedModelError(f"{source}: quantized weights ({method}) are not supported")
    try:
        num_heads = _int(raw, "num_attention_heads", source)
        hidden_size = _int(raw, "hidden_size", source)
        max_len = _int(raw, "max_position_embeddings", source)
        num_layers = _int(raw, "num_hidden_layers", source)
        theta, scaling = _parse_rope(raw, max_len, source, _DEFAULT_THETA.get(architecture))
        return ModelConfig(
            vocab_size=_int(raw, "vocab_size", source),
            hidden_size=hidden_size,
            intermediate_size=_int(raw, "intermediate_size", source),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim")
            or _DEFAULT_HEAD_DIM.get(architecture, hidden_size // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", _DEFAULT_EPS.get(architecture, 1e-5))),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_len,
            tie_word_embeddings=bool(
                raw.get("tie_word_embeddings", _DEFAULT_TIED.get(architecture, False))
            ),
            attention_bias=architecture == "qwen2",
            architecture=architecture,
            **{"layer_windows": windows, **_family_fields(raw, architecture, num_layers, source)},
        )
    except ConfigError as exc:
        raise ModelLoadError(f"{source}: {exc}") from exc


def _family_fields(
    raw: dict[str, Any], architecture: str, num_layers: int, source: Path
) -> dict[str, Any]:
    if architecture == "qwen3":
        return {"layer_windows": qwen3_windows(raw, num_layers, source)}
    if architecture == "gemma3_text":
        return gemma3_fields(raw, num_layers, source)
    return {}


def _int(raw: dict[str, Any], key: str, source: Path) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"{source}: field {key!r} must be an integer, got {value!r}")
    return value


def _check_architecture(raw: dict[str, Any], source: Path) -> str:
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    expected = SUPPORTED_ARCHITECTURES.get(model_type)  # type: ignore[arg-type]
    if expected is None or any(name != expected for name in architectures):
        found = f"model_type={model_type!r}, architectures={architectures}"
        supported = ", ".join(SUPPORTED_ARCHITECTURES.values())
        raise UnsupportedModelError(
            f"{source}: unsupported architecture ({found}); tieredkv serves {supported}"
        )
    return str(model_type)


# transformers' defaults where config.json leaves the field out
_MISTRAL_WINDOW = 4096
_QWEN2_WINDOW = 4096
_QWEN2_MAX_WINDOW_LAYERS = 28


def _sliding_windows(
    raw: dict[str, Any], architecture: str, source: Path
) -> tuple[int | None, ...]:
    """Each layer's sliding window as transformers applies it (empty: every layer full).

    Mistral: every layer, when `sliding_window` is set (absent: 4096, null: none). Qwen2: only
    with `use_sliding_window`, on the layers `layer_types` marks "sliding_attention", or without
    it from layer `max_window_layers` on. A window as long as `max_position_embeddings` never
    hides a key: those layers stay full.
    """
    if architecture not in ("mistral", "qwen2"):
        return ()
    num_layers, max_len = raw.get("num_hidden_layers"), raw.get("max_position_embeddings")
    if not isinstance(num_layers, int) or not isinstance(max_len, int):
        return ()  # parse_model_config names the missing field
    if architecture == "mistral":
        window = raw.get("sliding_window", _MISTRAL_WINDOW)
        sliding = [True] * num_layers
    else:
        window = raw.get("sliding_window", _QWEN2_WINDOW) if raw.get("use_sliding_window") else None
        sliding = _qwen2_sliding_layers(raw, num_layers, source)
    if window is None:
        return ()
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ModelLoadError(f"{source}: sliding_window must be a positive integer, got {window!r}")
    if window >= max_len or not any(sliding):
        return ()
    return tuple(window if is_sliding else None for is_sliding in sliding)


def _qwen2_sliding_layers(raw: dict[str, Any], num_layers: int, source: Path) -> list[bool]:
    layer_types = raw.get("layer_types")
    if layer_types is None:
        first = raw.get("max_window_layers", _QWEN2_MAX_WINDOW_LAYERS)
        return [layer >= first for layer in range(num_layers)]
    known = ("full_attention", "sliding_attention")
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ModelLoadError(f"{source}: layer_types must list {num_layers} layer types")
    for kind in layer_types:
        if kind not in known:
            message = f"layer_types entry {kind!r} is not one of {known}"
            raise UnsupportedModelError(f"{source}: {message}")
    return [kind == "sliding_attention" for kind in layer_types]


def _parse_rope(
    raw: dict[str, Any], max_len: int, source: Path, default_theta: float | None = None
) -> tuple[float, RopeScaling]:
    """RoPE base and scaling from either the old (`rope_theta` + `rope_scaling`) or the
    transformers-5 (`rope_parameters`) spelling; Gemma 3's global layers' where it has one
    entry per layer kind."""
    field = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if isinstance(params.get("full_attention"), dict):
        field, params = f"{field}.full_attention", dict(params["full_attention"])
    theta = float(params.get("rope_theta", raw.get("rope_theta", default_theta or 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in _LENGTH_DEPENDENT_ROPE:
        raise UnsupportedModelError(
            f"{source}: {field}: rope scaling {kind!r} depends on the sequence length; "
            "supported: default, linear, llama3, yarn"
        )
    if kind not in ("default", "linear", "llama3", "yarn"):
        raise UnsupportedModelError(f"{source}: unknown rope scaling type {kind!r}")
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UnsupportedModelError(f"{source}: partial_rotary_factor={partial} is not supported")
    if kind == "default":
        return theta, RopeScaling()
    original = int(params.get("original_max_position_embeddings") or max_len)
    factor = params.get("factor")
    if factor is None and kind == "yarn":
        factor = max_len / original  # DeepSeek-style: the factor is implied by the two lengths
    if factor is None:
        raise ModelLoadError(f"{source}: rope scaling {kind!r} needs a 'factor'")
    if kind == "yarn" and params.get("truncate", True) is False:
        raise UnsupportedModelError(f"{source}: yarn with truncate=false is not supported")
    return theta, RopeScaling(
        kind=kind,
        factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=_yarn_attention_factor(params, float(factor)) if kind == "yarn" else None,
    )


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    """YaRN's cos/sin scale: given, or from mscale/mscale_all_dim, or 0.1 ln(factor) + 1."""

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    if params.get("mscale") and params.get("mscale_all_dim"):
        return mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
    return mscale(factor)

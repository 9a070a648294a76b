"""The parts of a Hugging Face config that differ by family: the layers tieredkv refuses
(multimodal, Mamba/SSM, linear attention), each layer's attention window, and Gemma 3's fields.

Every default here is the one transformers applies when the field is absent, so a config read
here describes the model transformers would build from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tieredkv.errors import ModelLoadError, UnsupportedModelError

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# model_type -> the layers of that family that are not attention
_NON_ATTENTION_FAMILIES = {
    "jamba": "Mamba (SSM)",
    "falcon_h1": "Mamba (SSM)",
    "mamba": "Mamba (SSM)",
    "mamba2": "Mamba (SSM)",
    "bamba": "Mamba (SSM)",
    "zamba": "Mamba (SSM)",
    "zamba2": "Mamba (SSM)",
    "nemotron_h": "Mamba (SSM)",
    "granitemoehybrid": "Mamba (SSM)",
    "qwen3_next": "linear-attention (Gated DeltaNet)",
    "recurrent_gemma": "recurrent (RG-LRU)",
    "lfm2": "short-convolution",
}
# fields that hybrid families use to say which layers are not attention
_HYBRID_FIELDS = ("layers_block_type", "hybrid_override_pattern", "attn_layer_indices")
_GEMMA3_ACTIVATION = "gelu_pytorch_tanh"


def refuse_unsupported_layers(raw: dict[str, Any], source: Path) -> None:
    """UnsupportedModelError, in one line naming the field, for a multimodal model or one with
    layers that are not attention (Mamba/SSM, linear attention, recurrences)."""
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    if model_type == "gemma3" or "Gemma3ForConditionalGeneration" in architectures:
        raise UnsupportedModelError(
            f"{source}: model_type='gemma3' (Gemma3ForConditionalGeneration) is multimodal; "
            "tieredkv serves the text model, model_type 'gemma3_text' (Gemma3ForCausalLM)"
        )
    if "vision_config" in raw:
        raise UnsupportedModelError(
            f"{source}: vision_config: a multimodal model ({model_type!r}); "
            "tieredkv serves text-only decoders"
        )
    if model_type in _NON_ATTENTION_FAMILIES:
        raise UnsupportedModelError(
            f"{source}: model_type={model_type!r} has {_NON_ATTENTION_FAMILIES[model_type]} "
            "layers; tieredkv serves attention-only decoders"
        )
    for name in _HYBRID_FIELDS:
        if raw.get(name) is not None:
            raise UnsupportedModelError(
                f"{source}: {name}: a hybrid model with layers that are not attention; "
                "tieredkv serves attention-only decoders"
            )
    layer_types = raw.get("layer_types")
    for i, kind in enumerate(layer_types if isinstance(layer_types, list) else []):
        if kind not in ATTENTION_LAYER_TYPES:
            raise UnsupportedModelError(
                f"{source}: layer_types entry {kind!r} (layer {i}) is not one of "
                f"{ATTENTION_LAYER_TYPES}: Mamba/SSM and linear-attention layers are not supported"
            )


def layer_types(raw: dict[str, Any], num_layers: int, source: Path) -> list[str] | None:
    """The config's `layer_types` (one per layer), or None when it has none."""
    kinds = raw.get("layer_types")
    if kinds is None:
        return None
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise ModelLoadError(
            f"{source}: layer_types must list one entry per layer ({num_layers}), got {kinds!r}"
        )
    return kinds


def qwen3_windows(raw: dict[str, Any], num_layers: int, source: Path) -> tuple[int | None, ...]:
    """Qwen3's per-layer windows: none unless `use_sliding_window`; then `sliding_window` on the
    layers `layer_types` marks sliding, or else on layers from `max_window_layers` on. A window
    as long as `max_position_embeddings` never hides a key: every layer stays full."""
    window = raw.get("sliding_window")
    if not raw.get("use_sliding_window") or window is None:
        return ()
    window = _int_at_least("sliding_window", window, 1, source)
    if window >= raw.get("max_position_embeddings", window + 1):
        return ()
    kinds = layer_types(raw, num_layers, source)
    if kinds is None:
        first = _int_at_least("max_window_layers", raw.get("max_window_layers", 28), 0, source)
        kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return _windows(kinds, window)


def gemma3_fields(raw: dict[str, Any], num_layers: int, source: Path) -> dict[str, Any]:
    """The ModelConfig fields a Gemma 3 text config adds: its layer windows (`layer_types`, or
    every `sliding_window_pattern`-th layer global), the sliding layers' RoPE base, the
    attention scalar and the final logit soft-cap. Refuses what the forward pass cannot do."""
    activation = raw.get("hidden_activation", _GEMMA3_ACTIVATION)
    if activation != _GEMMA3_ACTIVATION:
        raise UnsupportedModelError(
            f"{source}: hidden_activation {activation!r} is not {_GEMMA3_ACTIVATION}"
        )
    if raw.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError(
            f"{source}: attn_logit_softcapping={raw['attn_logit_softcapping']}: soft-capped "
            "attention scores are not supported by the attention backends"
        )
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError(
            f"{source}: use_bidirectional_attention=true (an embedding model) is not supported"
        )
    kinds = layer_types(raw, num_layers, source)
    if kinds is None:
        pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", 6))
        pattern = _int_at_least("sliding_window_pattern", pattern, 1, source)
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(num_layers)
        ]
    # the sliding layers are also those that rotate by the local base: they need their window
    window = _int_at_least("sliding_window", raw.get("sliding_window", 4096), 1, source)
    cap = None
    if raw.get("final_logit_softcapping") is not None:
        cap = _positive_number(raw, "final_logit_softcapping", 0, source)
    return {
        "layer_windows": _windows(kinds, window),
        "rope_local_theta": _local_rope_theta(raw, source),
        "query_pre_attn_scalar": _positive_number(raw, "query_pre_attn_scalar", 256, source),
        "final_logit_softcapping": cap,
    }


def _local_rope_theta(raw: dict[str, Any], source: Path) -> float:
    """The sliding layers' RoPE base: `rope_parameters.sliding_attention` (transformers 5), or
    `rope_local_base_freq`; unscaled."""
    params = raw.get("rope_parameters")
    local = params.get("sliding_attention") if isinstance(params, dict) else None
    if not isinstance(local, dict):
        return float(raw.get("rope_local_base_freq", 10000.0))
    kind = local.get("rope_type", local.get("type", "default"))
    if kind != "default":
        raise UnsupportedModelError(
            f"{source}: rope_parameters.sliding_attention.rope_type={kind!r}: the sliding "
            "layers' RoPE must be unscaled"
        )
    return float(local.get("rope_theta", 10000.0))


def _windows(kinds: list[str], window: int) -> tuple[int | None, ...]:
    return tuple(window if kind == "sliding_attention" else None for kind in kinds)


def _positive_number(raw: dict[str, Any], key: str, default: float, source: Path) -> float:
    value = raw.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ModelLoadError(f"{source}: field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _int_at_least(key: str, value: Any, minimum: int, source: Path) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ModelLoadError(
            f"{source}: field {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value

"""Read the weights of a Hugging Face safetensors directory (one file, or shards plus an index).

Every expected tensor must be present with the expected shape; anything we would silently
ignore (an o_proj bias, an extra expert) is an error instead, because ignoring it would serve a
different model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tieredkv.errors import ModelLoadError
from tieredkv.model_config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of `model_dir`, in a stable order: the index's shards, or every
    `*.safetensors` file. ModelLoadError if there are none or a listed shard is missing."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc!r})") from exc
        missing = [name for name in names if not (model_dir / name).is_file()]
        if missing:
            raise ModelLoadError(f"{index}: lists shard file(s) that do not exist: {missing}")
        return [model_dir / name for name in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        found = sorted(p.name for p in model_dir.iterdir())[:10]
        raise ModelLoadError(
            f"{model_dir}: no *.safetensors weight file (found {found}); "
            "tieredkv reads safetensors directories and .gguf files"
        )
    return files


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor names and shapes for `config` (lm_head absent when tied): Llama's,
    plus the q/k norms of Qwen3 and Gemma 3 and the feed-forward norms of Gemma 3."""
    h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
    q = config.num_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
        if config.architecture in ("qwen3", "gemma3_text"):
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        if config.architecture == "gemma3_text":
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
    return shapes


def read_weights(
    files: list[Path], config: ModelConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """All tensors of `config` from `files`, cast to `dtype`, contiguous on the CPU."""
    shapes = expected_shapes(config)
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        for name, tensor in _read_file(path, shapes, config.tie_word_embeddings):
            weights[name] = tensor.to(dtype).contiguous()
    missing = [name for name in shapes if name not in weights]
    if missing:
        where = files[0].parent
        raise ModelLoadError(
            f"{where}: {len(missing)} tensor(s) missing from {[p.name for p in files]}, "
            f"e.g. {missing[:3]}"
        )
    return weights


def _read_file(
    path: Path, shapes: dict[str, tuple[int, ...]], tied: bool
) -> list[tuple[str, torch.Tensor]]:
    out = []
    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                if name not in shapes:
                    raise ModelLoadError(
                        f"{path}: unexpected tensor {name!r}; the model has parts tieredkv "
                        "does not implement"
                    )
                tensor = handle.get_tensor(name)
                if tuple(tensor.shape) != shapes[name]:
                    raise ModelLoadError(
                        f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {shapes[name]}"
                    )
                out.append((name, tensor))
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: corrupt or truncated safetensors file ({exc})") from exc
    return out

"""A Qwen3 GGUF file (written here from a tiny random directory, fp32 tensors under llama.cpp's
names, the tiny BPE as GGUF tokenizer metadata) loads through the transformers conversion with
the directory's exact weights and config, and generates the directory's greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.model_factory import make_tiny_model_dir
from tests.support.greedy import generate_greedy
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner

# Hugging Face name inside a layer -> llama.cpp's
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_MODEL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(name: str) -> str:
    if name in _MODEL_NAMES:
        return _MODEL_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[rest]}"


def write_qwen3_gguf(model_dir: Path, path: Path) -> Path:
    """`model_dir`'s weights and config as a GGUF file at `path`, in fp32."""
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())["model"]
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    tokens = sorted(tokenizer["vocab"], key=tokenizer["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])  # 3: control
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["merges"]])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        writer.add_tensor(gguf_name(name), tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_qwen3_gguf_loads_the_directorys_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    # transformers' GGUF reader takes Qwen3's head_dim from Qwen3Config's default, 128
    model_dir = make_tiny_model_dir(
        tmp_path, "qwen3", num_heads=2, num_kv_heads=1, head_dim=128, tie_word_embeddings=tied
    )
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(tmp_path / "cache"))
    from_gguf = load_model(write_qwen3_gguf(model_dir, tmp_path / "tiny-qwen3.gguf"))
    from_dir = load_model(model_dir)
    assert from_gguf.model_dir != model_dir and from_gguf.config.architecture == "qwen3"
    assert from_gguf.config.tie_word_embeddings is tied
    assert set(from_gguf.weights) == set(from_dir.weights)
    for name, tensor in from_dir.weights.items():
        assert torch.equal(from_gguf.weights[name], tensor), name
    prompt = list(range(3, 40))
    assert greedy(from_gguf, prompt) == greedy(from_dir, prompt)


def greedy(model: LoadedModel, prompt: list[int]) -> list[int]:
    runner = ModelRunner.create(model.config, model.weights, num_pages=64, page_size=4)
    return generate_greedy(runner, prompt, max_new_tokens=12)

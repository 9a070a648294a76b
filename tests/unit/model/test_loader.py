"""Loading Hugging Face safetensors directories: weights equal transformers', clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.model_factory import make_tiny_model_dir
from tieredkv.errors import ModelLoadError, UnsupportedModelError
from tieredkv.model.hf_dir import expected_shapes
from tieredkv.model.loader import load_model


def _reference_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.state_dict()


@pytest.mark.parametrize(
    ("arch", "tied", "shard"),
    [("llama", True, None), ("qwen2", False, None), ("mistral", False, "60KB")],
)
def test_weights_equal_transformers(tmp_path: Path, arch: str, tied: bool, shard: str) -> None:
    model_dir = make_tiny_model_dir(tmp_path, arch, tie_word_embeddings=tied, max_shard_size=shard)
    model = load_model(model_dir)
    reference = _reference_state_dict(model_dir)
    assert set(model.weights) == set(expected_shapes(model.config))
    for name, tensor in model.weights.items():
        assert tensor.dtype == torch.float32 and tensor.device.type == "cpu"
        assert torch.equal(tensor, reference[name]), name
    assert ("lm_head.weight" in model.weights) is not tied
    has_bias = "model.layers.1.self_attn.k_proj.bias" in model.weights
    assert has_bias is (arch == "qwen2") and model.config.attention_bias is (arch == "qwen2")
    assert model.config.num_kv_heads == 2 and model.config.num_heads == 4  # GQA
    assert model.model_dir == model_dir and model.name == f"tiny-{arch}"
    assert len(model.weights_digest) == 16
    if shard:
        assert (model_dir / "model.safetensors.index.json").is_file()


def test_dtype_cast_at_load(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path, "qwen2")
    fp32 = load_model(model_dir)
    bf16 = load_model(model_dir, dtype=torch.bfloat16)
    for name, tensor in bf16.weights.items():
        assert tensor.dtype == torch.bfloat16 and tensor.is_contiguous()
        assert torch.equal(tensor, fp32.weights[name].to(torch.bfloat16)), name
    assert bf16.weights_digest == fp32.weights_digest  # same files


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nowhere: no such file or directory"):
        load_model(tmp_path / "nowhere")


def test_missing_config_json(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tiny-llama: config.json not found"):
        load_model(model_dir)


def test_unsupported_architecture_in_a_directory(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    config.update(model_type="mixtral", architectures=["MixtralForCausalLM"])
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as info:
        load_model(model_dir)
    assert "config.json: unsupported architecture" in str(info.value)
    assert "mixtral" in str(info.value)


def test_sliding_window_mistral_loads_with_its_window_on_every_layer(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path, "mistral", sliding_window=128)
    assert load_model(model_dir).config.layer_windows == (128, 128)


def test_truncated_safetensors(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    path = model_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError) as info:
        load_model(model_dir)
    assert f"{path}: corrupt or truncated safetensors file" in str(info.value)


def test_corrupt_safetensors_header(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    path = model_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32  # the JSON header
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"model.safetensors: corrupt or truncated"):
        load_model(model_dir)


def _rewrite(model_dir: Path, edit: callable) -> None:  # type: ignore[valid-type]
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensors(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    _rewrite(model_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError) as info:
        load_model(model_dir)
    message = str(info.value)
    assert "1 tensor(s) missing from ['model.safetensors']" in message
    assert "model.layers.1.mlp.up_proj.weight" in message


def test_untied_model_without_lm_head_is_missing_a_tensor(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path, tie_word_embeddings=False)
    _rewrite(model_dir, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ModelLoadError, match=r"lm_head.weight"):
        load_model(model_dir)


def test_wrong_shape_and_unexpected_tensor(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    _rewrite(model_dir, lambda t: t.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(ModelLoadError, match=r"'model.norm.weight' has shape \(63,\)"):
        load_model(model_dir)
    other = make_tiny_model_dir(tmp_path, name="extra")
    _rewrite(other, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.ones(64)}))
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'model.layers.0.self_attn.o_proj"):
        load_model(other)


def test_missing_shard(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path, max_shard_size="60KB")
    shard = sorted(model_dir.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(model_dir)
    assert "model.safetensors.index.json: lists shard file(s) that do not exist" in str(info.value)
    assert shard.name in str(info.value)


def test_no_weight_files_and_not_a_model(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    (model_dir / "model.safetensors").rename(model_dir / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors weight file"):
        load_model(model_dir)
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"notes.txt: neither a model directory nor a .gguf"):
        load_model(stray)


def test_tokenizer_larger_than_the_model_vocab(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    _rewrite(
        model_dir,
        lambda t: t.update(
            {
                "model.embed_tokens.weight": t["model.embed_tokens.weight"][:300].clone(),
                "lm_head.weight": t["lm_head.weight"][:300].clone(),
            }
        ),
    )
    (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    with pytest.raises(ModelLoadError, match=r"tokenizer has 320 tokens but the model's vocab"):
        load_model(model_dir)


def test_missing_tokenizer(tmp_path: Path) -> None:
    model_dir = make_tiny_model_dir(tmp_path)
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer.json: tokenizer.json not found"):
        load_model(model_dir)

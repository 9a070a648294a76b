"""Fixtures for the model tests.

The default model is converted at most once per test session, into the cache the environment
names (`$TIEREDKV_CACHE_DIR`, `$XDG_CACHE_HOME/tieredkv` or `~/.cache/tieredkv`), and reused
as is when an earlier session or `tieredkv serve` already converted it. Every test then runs
with `TIEREDKV_CACHE_DIR` pointing at its own directory, so nothing else (digest entries, GGUF
conversions of test files) lands in the user's cache; that directory links to the converted
default model when there is one, so `load_model()` still finds it without converting again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tieredkv.model.default_model import DEFAULT_MODEL_NAME, cache_root, default_model_dir
from tieredkv.model.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def user_cache_root() -> Path:
    """The cache root the environment names, read before any test changes it."""
    return cache_root()


@pytest.fixture(scope="session")
def default_dir(user_cache_root: Path) -> Path:
    """The converted default model directory (converts once, ~15 s, if not cached)."""
    return default_model_dir()


@pytest.fixture(scope="session")
def default_model(default_dir: Path) -> LoadedModel:
    """The default model loaded in fp32 (shared: do not mutate its weights)."""
    return load_model(default_dir, dtype=torch.float32)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_cache_root: Path) -> Path:
    """Each test's cache root is a fresh directory (set after the session fixtures ran)."""
    cache = tmp_path / "tieredkv-cache"
    cache.mkdir()
    converted = user_cache_root / DEFAULT_MODEL_NAME
    if converted.is_dir():
        (cache / DEFAULT_MODEL_NAME).symlink_to(converted, target_is_directory=True)
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(cache))
    return cache

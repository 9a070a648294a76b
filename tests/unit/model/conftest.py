"""Fixtures for the model tests.

The default model is converted at most once per test session, into the cache the environment
names (`$TIEREDKV_CACHE_DIR`, `$XDG_CACHE_HOME/tieredkv` or `~/.cache/tieredkv`), and reused
as is when an earlier session or `tieredkv serve` already converted it. Every test then runs
with `TIEREDKV_CACHE_DIR` pointing at its own empty directory, so nothing else is written to
the user's cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tieredkv.model.default_model import default_model_dir
from tieredkv.model.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def default_dir() -> Path:
    """The converted default model directory (converts once, ~15 s, if not cached)."""
    return default_model_dir()


@pytest.fixture(scope="session")
def default_model(default_dir: Path) -> LoadedModel:
    """The default model loaded in fp32 (shared: do not mutate its weights)."""
    return load_model(default_dir, dtype=torch.float32)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's cache root is a fresh directory (set after the session fixtures ran)."""
    cache = tmp_path / "tieredkv-cache"
    monkeypatch.setenv("TIEREDKV_CACHE_DIR", str(cache))
    return cache

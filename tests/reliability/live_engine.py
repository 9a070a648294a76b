"""The real engine on a tiny random Llama, in this process, behind the real app under uvicorn
as `tieredkv serve` runs it (`server.runner.uvicorn_config`: uvloop, h11, the connection
limits): for tests that need `ServerConfig` bounds no command-line flag sets (the 1 s header,
body and stall timeouts) and a server that starts in seconds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tieredkv.server.app import create_app

from tests.model_factory import make_tiny_model_dir
from tests.unit.server.conftest import serve
from tieredkv.config import CacheConfig, EngineConfig, ServerConfig
from tieredkv.engine.async_engine import AsyncEngine
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.model.loader import LoadedModel, load_model

TINY_NAME = "tiny-llama"
MAX_MODEL_LEN = 512
CACHE = CacheConfig(device_cache_bytes=8 << 20, host_cache_bytes=0)


def tiny_llama(directory: Path) -> LoadedModel:
    """A 2-layer random Llama with the tiny ChatML tokenizer (fp32), written under `directory`."""
    return load_model(make_tiny_model_dir(directory, init_std=0.5), dtype=torch.float32)


@contextmanager
def started_engine(
    model: LoadedModel, max_num_seqs: int = 16, cache: CacheConfig = CACHE
) -> Iterator[AsyncEngine]:
    """`AsyncEngine.start` as `tieredkv serve` calls it (warm-up included); shut down after."""
    config = EngineConfig(max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs)
    engine = AsyncEngine.start(model, cache, config, EngineMetrics())
    try:
        yield engine
    finally:
        asyncio.run(engine.shutdown())


@contextmanager
def live_server(
    model: LoadedModel, config: ServerConfig, max_num_seqs: int = 16, cache: CacheConfig = CACHE
) -> Iterator[str]:
    """The real engine and app served on 127.0.0.1 (an ephemeral port); its base URL."""
    with started_engine(model, max_num_seqs, cache) as engine:
        app = create_app(
            engine, model.tokenizer, config, TINY_NAME, engine.max_model_len, clock=engine.clock
        )
        with serve(app, config) as base_url:
            yield base_url

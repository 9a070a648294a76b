"""The engine thread faults the host tier in while it has nothing else to do."""

from __future__ import annotations

import asyncio
import time

import pytest

from tieredkv.config import CacheConfig, EngineConfig
from tieredkv.engine.async_engine import AsyncEngine
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.model.loader import LoadedModel


def test_an_idle_engine_faults_in_the_host_tier(tiny_model: LoadedModel) -> None:
    cache = CacheConfig(device_cache_bytes=4 << 20, host_cache_bytes=16 << 20)
    engine = AsyncEngine.start(tiny_model, cache, EngineConfig(max_model_len=256), EngineMetrics())
    try:
        prefaulter = engine.engine.cache.pools.host.prefaulter
        assert prefaulter is not None and prefaulter.length > (15 << 20)
        deadline = time.monotonic() + 30
        while not prefaulter.done and time.monotonic() < deadline:
            time.sleep(0.01)
        if prefaulter.unsupported:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE")
        assert prefaulter.done  # all of it, chunk by chunk, with no request to serve
        assert prefaulter.faulted == prefaulter.length
    finally:
        asyncio.run(engine.shutdown())

"""`tieredkv_tier_cached_tokens` through the real engine and app: after a request, /metrics
gives the tokens of KV each tier holds for each layer kind, the numbers /health's `layer_kinds`
reports; a model without sliding layers has the same series, its sliding ones at 0."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from tieredkv.server.app import create_app

from tests.model_factory import make_tiny_model_dir
from tests.unit.model.test_qwen3_gemma3_forward import prompt_of, tiny_family_model
from tests.unit.server.test_prometheus_metrics import parse
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, EngineConfig, ServerConfig
from tieredkv.engine.async_engine import AsyncEngine
from tieredkv.engine.metrics import TIER_LABELS, EngineMetrics
from tieredkv.model.loader import LoadedModel, load_model

NAME = "tiny"
PAGE_SIZE = 16
PROMPT_LEN, NEW_TOKENS = 100, 4  # KV of 103 tokens: 6 whole pages
CACHED_TOKENS = (PROMPT_LEN + NEW_TOKENS - 1) // PAGE_SIZE * PAGE_SIZE
SIZES = dict(device_cache_bytes=8 << 20, host_cache_bytes=8 << 20, page_size=PAGE_SIZE)


@contextmanager
def served(model: LoadedModel, cache: CacheConfig) -> Iterator[tuple[AsyncEngine, TestClient]]:
    engine = AsyncEngine.start(model, cache, EngineConfig(max_model_len=256), EngineMetrics())
    app = create_app(engine, model.tokenizer, ServerConfig(), NAME, 256, clock=engine.clock)
    try:
        with TestClient(app) as client:
            yield engine, client
    finally:
        asyncio.run(engine.shutdown())


def on_engine_thread(engine: AsyncEngine, fn: Callable[[], Any]) -> Any:
    """`fn()` run at the top of an engine step, and its result."""
    done: concurrent.futures.Future = concurrent.futures.Future()
    engine.engine.call_soon(lambda: done.set_result(fn()))
    return done.result(timeout=30)


def complete_and_settle(engine: AsyncEngine, client: TestClient) -> None:
    """One greedy completion, then until its write-through copies are applied and a whole
    step has run since: the engine idle, the gauges its last step's figures."""
    body = {"model": NAME, "prompt": prompt_of(PROMPT_LEN, seed=40), "max_tokens": NEW_TOKENS}
    response = client.post("/v1/completions", json={**body, "ignore_eos": True})
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 30
    while on_engine_thread(engine, engine.engine.cache.transfers_in_flight):
        assert time.monotonic() < deadline, "copies still in flight after 30 s"
    on_engine_thread(engine, lambda: None)  # a step after the last change recorded its figures


def cached_tokens(client: TestClient) -> dict[str, dict[str, float]]:
    """/metrics' `tieredkv_tier_cached_tokens`: layer kind -> tier -> tokens."""
    _, _, samples = parse(client.get("/metrics").text)
    series: dict[str, dict[str, float]] = {"full": {}, "sliding": {}}
    for (name, labels), value in samples.items():
        if name == "tieredkv_tier_cached_tokens":
            series[dict(labels)["layer_kind"]][dict(labels)["tier"]] = value
    return series


def tokens_by_tier_in_health(client: TestClient) -> dict[str, dict[str, int]]:
    kinds = client.get("/health").json()["layer_kinds"]
    return {kind: kinds[kind]["tokens_by_tier"] for kind in ("full", "sliding")}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("llama"), init_std=0.5)
    return load_model(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    directory: Path = tmp_path_factory.mktemp("gemma3")
    model_dir = tiny_family_model(directory, "gemma3", sliding_window=16)
    return load_model(model_dir, dtype=torch.float32)


def test_a_llama_reports_its_pages_as_full_tokens_and_no_sliding_ones(llama) -> None:
    with served(llama, CacheConfig(**SIZES)) as (engine, client):
        assert cached_tokens(client) == {
            "full": dict.fromkeys(TIER_LABELS, 0),
            "sliding": dict.fromkeys(TIER_LABELS, 0),
        }
        complete_and_settle(engine, client)
        series = cached_tokens(client)
        device_pages = engine.engine.cache.tier_parts_held(Tier.DEVICE)[0]
    # the request's whole pages, on device and written through to host
    assert series["full"] == {
        "device": CACHED_TOKENS,
        "host": CACHED_TOKENS,
        "disk": 0,
        "remote": 0,
    }
    assert device_pages * PAGE_SIZE == CACHED_TOKENS
    assert series["sliding"] == dict.fromkeys(TIER_LABELS, 0)


def test_a_gemma3_split_device_and_host_report_each_layer_kind_as_health_does(gemma3) -> None:
    cache = CacheConfig(**SIZES)  # split device and host pools: the default for sliding layers
    with served(gemma3, cache) as (engine, client):
        complete_and_settle(engine, client)
        series, health = cached_tokens(client), tokens_by_tier_in_health(client)
    assert series == health
    # both keep sliding parts only where the path's end reads them: the page of its window's
    # 15 tokens and the margin's pages before it
    for tier in ("device", "host"):
        assert series["full"][tier] == CACHED_TOKENS
        assert series["sliding"][tier] == (1 + REUSE_MARGIN_PAGES) * PAGE_SIZE < CACHED_TOKENS

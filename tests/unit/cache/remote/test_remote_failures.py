"""A remote store that fails costs hits, never a request: Redis killed, hung, full (evicting)
or refusing our password → calls return "nothing found" within their budget, the store says
degraded, and it comes back by itself once Redis does."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, require_redis
from tests.unit.cache.remote.conftest import FAST_RECONNECT, PAGE_BYTES, make_pages
from tieredkv.cache.remote.password import PASSWORD_ENV, password_from_env_or_file
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.errors import ConfigError

FLUSH_S = 10.0
HEAL_S = 10.0
# A correctness bound, not a performance figure: the budget plus room for a busy machine.
SLACK = 10.0
OpenStore = Callable[..., RemoteStore]


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


def assert_calls_give_up_in_budget(store: RemoteStore, keys: list[bytes]) -> None:
    budget = store.timeouts
    found, lookup_s = timed(lambda: store.lookup(keys))
    assert found == 0 and lookup_s < SLACK * budget.lookup_s, lookup_s
    pages, fetch_s = timed(lambda: store.fetch(keys))
    assert pages == [None] * len(keys)
    assert fetch_s < SLACK * budget.fetch_budget_s(len(keys) * PAGE_BYTES), fetch_s
    assert store.degraded


def test_killed_redis_degrades_then_heals(redis_server: RedisServer, open_store: OpenStore) -> None:
    store = open_store(redis_server.url, timeouts=FAST_RECONNECT)
    pages = make_pages(4, seed=10)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    keys = [page.key for page in pages]
    redis_server.kill()
    assert_calls_give_up_in_budget(store, keys)
    assert store.counters().errors >= 1
    store.put(make_pages(2, seed=11))  # queued while degraded, never raises
    redis_server.start()  # same port, empty (no persistence)
    assert store.wait_healthy(HEAL_S)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    assert store.lookup(keys) == 4
    assert store.fetch(keys) == [page.data for page in pages]


def test_hung_redis_times_out_within_budget(
    redis_server: RedisServer, open_store: OpenStore
) -> None:
    store = open_store(redis_server.url, timeouts=FAST_RECONNECT)
    pages = make_pages(3, seed=12)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    redis_server.pause()
    try:
        found, lookup_s = timed(lambda: store.lookup([page.key for page in pages]))
        assert found == 0 and lookup_s < SLACK * store.timeouts.lookup_s, lookup_s
        assert store.degraded
        assert_calls_give_up_in_budget(store, [page.key for page in pages])
    finally:
        redis_server.resume()
    assert store.wait_healthy(HEAL_S)
    assert store.fetch([page.key for page in pages]) == [page.data for page in pages]


def test_unreachable_at_start_is_degraded_not_an_error(open_store: OpenStore) -> None:
    require_redis()
    server = RedisServer(Path("/nonexistent"))  # a free port nobody listens on
    store = open_store(server.url, timeouts=FAST_RECONNECT)
    assert store.degraded and "Connection" in store.last_error
    assert_calls_give_up_in_budget(store, [page.key for page in make_pages(2)])


def test_evicted_page_is_a_miss_not_an_error(tmp_path: Path, open_store: OpenStore) -> None:
    require_redis()
    lru = ("--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
    server = RedisServer(tmp_path / "lru", extra_args=lru).start()
    try:
        store = open_store(server.url)
        pages = make_pages(4, seed=13)
        store.put(pages)
        assert store.flush_writes(FLUSH_S)
        keys = [page.key for page in pages]
        assert store.lookup(keys) == 4
        store.put(make_pages(60, seed=14))  # ~21 MiB through an 8 MiB store
        assert store.flush_writes(FLUSH_S)
        pages_back = store.fetch(keys)
        assert None in pages_back
        assert all(got in (None, page.data) for got, page in zip(pages_back, pages, strict=True))
        counters = store.counters()
        assert counters.errors == 0 and sum(counters.refused.values()) == 0 and store.healthy
        assert counters.misses == pages_back.count(None)
        store.put(pages)  # an evicted page is forgotten as known, so it is written again
        assert store.flush_writes(FLUSH_S)
        assert store.fetch(keys[-1:]) == [pages[-1].data]
    finally:
        server.stop()


def test_password_from_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_store: OpenStore
) -> None:
    require_redis()
    server = RedisServer(tmp_path / "auth", password="s3cret-pw").start()
    try:
        monkeypatch.setenv(PASSWORD_ENV, "s3cret-pw")
        from_env = open_store(server.url, password=password_from_env_or_file())
        assert from_env.healthy
        monkeypatch.delenv(PASSWORD_ENV)
        secret = tmp_path / "redis-password"
        secret.write_text("s3cret-pw\n")
        os.chmod(secret, 0o600)
        from_file = open_store(server.url, password=password_from_env_or_file(secret))
        pages = make_pages(2, seed=15)
        from_file.put(pages)
        assert from_file.flush_writes(FLUSH_S)
        assert from_file.fetch([page.key for page in pages]) == [page.data for page in pages]
        wrong = open_store(server.url, password="wrong", timeouts=FAST_RECONNECT)
        assert wrong.degraded and "Authentication" in wrong.last_error
        assert wrong.lookup([page.key for page in pages]) == 0
        nothing = open_store(server.url, timeouts=FAST_RECONNECT)
        assert nothing.degraded
    finally:
        server.stop()


def test_password_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    assert password_from_env_or_file() is None
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    os.chmod(secret, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        password_from_env_or_file(secret)
    with pytest.raises(ConfigError, match="pw-missing"):
        password_from_env_or_file(tmp_path / "pw-missing")
    with pytest.raises(ConfigError, match="must not carry a password"):
        RemoteStore("redis://:pw@127.0.0.1:1/0", b"f", 16, 1024)

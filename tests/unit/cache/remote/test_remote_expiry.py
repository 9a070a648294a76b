"""Retained pages' expiry in a real Redis: the store sets it on the pages it holds and writes
those it does not hold with it, retaining again restarts it, other pages carry none; in the
cache, retaining a prompt gives its pages 24 hours in Redis, written there if missing. Redis's
maxmemory-policy is read at connection, and one that would evict retained pages alone (or
nothing) is warned of."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.redis_servers import RedisServer, require_redis
from tests.support.tiny_cache import FINGERPRINT, fill_device_pages, tiny_layout
from tests.unit.cache.cache_steps import ok
from tests.unit.cache.remote.conftest import FINGERPRINT as STORE_FINGERPRINT
from tests.unit.cache.remote.conftest import make_pages
from tieredkv.cache.build import build_cache
from tieredkv.cache.page_record import fingerprint_digest
from tieredkv.cache.remote.connection import RemoteTimeouts, open_client
from tieredkv.cache.remote.keys import KEY_PREFIX, redis_key
from tieredkv.cache.remote.secret import StoreKeys
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.retention import RETENTION_S
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig

TTL_S = 3600.0
SLACK_MS = 120_000  # a busy test machine: the expiry is set within two minutes of `retain`
FLUSH_S = 30.0
LAYOUT = tiny_layout(4)
STORE_KEYS = StoreKeys.derive(None, fingerprint_digest(STORE_FINGERPRINT))  # open_store's


def redis_name(page_key: bytes) -> str:
    """The Redis key the test stores keep a page under."""
    return redis_key(STORE_KEYS.name(page_key))


@pytest.fixture(params=["single", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    if request.param == "single":
        return request.getfixturevalue("redis_server").url
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flush()  # one cluster serves the module's tests
    return cluster.url


@pytest.fixture
def plain(redis_url: str) -> Iterator[Any]:
    """A client of the test's Redis, single or cluster, for looking at the keys."""
    client = open_client(redis_url, None, RemoteTimeouts())
    yield client
    client.close()


def pttl(client: Any, key: bytes) -> int:
    """The key's expiry in ms: -1 without one, -2 when the key is absent."""
    return int(client.pttl(redis_name(key)))


def expires_in(client: Any, key: bytes, ttl_s: float) -> bool:
    return ttl_s * 1e3 - SLACK_MS < pttl(client, key) <= ttl_s * 1e3


def test_retained_pages_expire_whether_written_before_or_after(
    redis_url: str, plain: Any, open_store: Callable[..., RemoteStore]
) -> None:
    store = open_store(redis_url)
    assert store.wait_healthy(10)
    pages = make_pages(7, seed=3)
    keys = [page.key for page in pages]
    store.put(pages[:3])
    assert store.flush_writes(FLUSH_S)
    store.retain(keys[:5], TTL_S)  # three written already, two not yet
    store.put(pages[3:6])
    assert store.flush_writes(FLUSH_S)
    assert all(expires_in(plain, key, TTL_S) for key in keys[:5])
    assert pttl(plain, keys[5]) == -1  # written, never retained: no expiry
    assert pttl(plain, keys[6]) == -2  # never written
    assert store.counters().expiries_set >= 5  # a page written with it may be PEXPIREd too
    assert store.counters().writes == 6


def test_retaining_again_restarts_the_expiry_and_other_replicas_keep_it(
    redis_url: str, plain: Any, open_store: Callable[..., RemoteStore]
) -> None:
    first, second = open_store(redis_url), open_store(redis_url)
    assert first.wait_healthy(10) and second.wait_healthy(10)
    pages = make_pages(4, seed=4)
    keys = [page.key for page in pages]
    first.put(pages)
    first.retain(keys, TTL_S)
    assert first.flush_writes(FLUSH_S)
    for key in keys:
        plain.pexpire(redis_name(key), 60_000)  # as if 23 hours had passed
    second.put(pages)  # another replica computes the same pages: they stay as they are
    assert second.flush_writes(FLUSH_S)
    assert all(0 < pttl(plain, key) <= 60_000 for key in keys)
    second.retain(keys, TTL_S)  # retained again, on any replica
    assert second.flush_writes(FLUSH_S)
    assert all(expires_in(plain, key, TTL_S) for key in keys)


def test_a_retained_page_the_store_lost_is_written_again_with_its_expiry(
    redis_url: str, plain: Any, open_store: Callable[..., RemoteStore]
) -> None:
    store = open_store(redis_url)
    assert store.wait_healthy(10)
    pages = make_pages(2, seed=5)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    plain.delete(redis_name(pages[0].key))  # evicted by Redis
    store.retain([page.key for page in pages], TTL_S)
    assert store.flush_writes(FLUSH_S)
    assert pttl(plain, pages[0].key) == -2
    assert store.take_lost() == {pages[0].key}  # reported once, for the cache to write again
    assert store.take_lost() == set()
    store.put(pages)  # known absent now: written again, with its expiry
    assert store.flush_writes(FLUSH_S)
    assert all(expires_in(plain, page.key, TTL_S) for page in pages)


@pytest.fixture
def cache(redis_server: RedisServer) -> Iterator[TieredCache]:
    config = CacheConfig(
        page_size=LAYOUT.page_size,
        device_cache_bytes=16 * LAYOUT.page_bytes,
        host_cache_bytes=16 * LAYOUT.page_bytes,
        remote_cache_url=redis_server.url,
        remote_budget_scale=20.0,
        retention_budget_bytes=8 * LAYOUT.page_bytes,
    )
    cache = build_cache(config, LAYOUT, FINGERPRINT, "cpu")
    assert cache.pools.remote is not None and cache.pools.remote.store.wait_healthy(10)
    yield cache
    cache.close()


def computed(cache: TieredCache, tokens: list[int]) -> None:
    """Compute and insert `tokens`' full pages (written to the remote tier at insert)."""
    pages = cache.allocate(len(tokens) // cache.page_size)
    assert pages is not None
    fill_device_pages(cache, tokens, "default", pages)
    result = cache.insert(tokens, "default", pages)
    cache.free([p for p in pages if p not in result.device_pages])
    settled(cache)


def settled(cache: TieredCache) -> None:
    deadline = time.monotonic() + FLUSH_S
    while cache.transfers_in_flight() and time.monotonic() < deadline:
        cache.wait(0.1)
    assert cache.pools.remote is not None and cache.pools.remote.store.flush_writes(FLUSH_S)
    ok(cache)


def expiries(redis_server: RedisServer) -> list[int]:
    """PTTL of every page in the store."""
    names = redis_server.cli("KEYS", KEY_PREFIX + "*").split()
    return [int(redis_server.cli("PTTL", name)) for name in names]


def names_expiring(redis_server: RedisServer) -> dict[str, int]:
    """Every page's Redis key and its PTTL (-1: no expiry)."""
    names = redis_server.cli("KEYS", KEY_PREFIX + "*").split()
    return {name: int(redis_server.cli("PTTL", name)) for name in names}


def in_a_day(found: dict[str, int]) -> int:
    """How many of `found` expire 24 hours from about now."""
    day_ms = RETENTION_S * 1e3
    return sum(day_ms - SLACK_MS < ms <= day_ms for ms in found.values())


def test_a_retained_prompt_gets_24_hours_in_redis(redis_server: RedisServer, cache) -> None:
    ordinary = list(range(100, 113))  # 3 full pages
    retained = list(range(500, 521))  # 5 full pages
    computed(cache, ordinary)
    computed(cache, retained)
    assert sorted(names_expiring(redis_server).values()) == [-1] * 8
    assert cache.retention.retain(retained, "default", now=0.0)
    settled(cache)
    found = names_expiring(redis_server)
    assert in_a_day(found) == 5 and list(found.values()).count(-1) == 3, found
    assert cache.retention.figures(now=1.0).pages_by_tier[Tier.REMOTE] == 5
    retained_names = [name for name, ms in found.items() if ms > 0]
    for name in retained_names:
        redis_server.cli("PEXPIRE", name, "60000")  # as if 23 hours had passed
    assert cache.retention.retain(retained, "default", now=2.0)  # the same prompt again
    settled(cache)
    assert in_a_day(names_expiring(redis_server)) == 5


def test_a_flushed_retained_prompt_computed_again_gets_its_expiry_again(
    redis_server: RedisServer, cache
) -> None:
    retained = list(range(700, 717))  # 4 full pages
    computed(cache, retained)
    assert cache.retention.retain(retained, "default", now=0.0)
    settled(cache)
    assert in_a_day(names_expiring(redis_server)) == 4
    redis_server.cli("FLUSHALL")  # Redis lost them (evicted, or restarted empty)
    cache.flush()  # and a flush forgets the prompt here, retained or not
    assert sum(cache.match([*retained, 0]).tokens_by_tier().values()) == 0
    computed(cache, retained)  # computed again, then retained again
    assert cache.retention.retain(retained, "default", now=1.0)
    settled(cache)
    assert in_a_day(names_expiring(redis_server)) == 4


@pytest.mark.parametrize(
    ("policy", "warned"),
    [("allkeys-lru", False), ("volatile-lru", True), ("volatile-ttl", True), ("noeviction", True)],
)
def test_the_memory_policy_is_read_and_a_bad_one_warned_of(
    tmp_path, policy: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis()
    limits = ("--maxmemory", "64mb", "--maxmemory-policy", policy)
    server = RedisServer(tmp_path / "redis", extra_args=limits).start()
    try:
        with caplog.at_level(logging.WARNING, logger="tieredkv.cache.remote.memory_policy"):
            store = RemoteStore(server.url, FINGERPRINT, 16, 1024)
        try:
            assert store.wait_healthy(10) and store.memory_policy == policy
        finally:
            store.close()
    finally:
        server.stop()
    assert any(policy in record.getMessage() for record in caplog.records) == warned


def test_a_retained_prompt_redis_lost_while_indexed_is_written_again(
    redis_server: RedisServer, cache
) -> None:
    retained = list(range(900, 917))  # 4 full pages
    computed(cache, retained)
    assert cache.retention.retain(retained, "default", now=0.0)
    settled(cache)
    redis_server.cli("FLUSHALL")  # Redis restarted empty: this replica still indexes them
    assert cache.retention.figures(now=5.0).pages_by_tier[Tier.REMOTE] == 4
    assert cache.retention.retain(retained, "default", now=6.0)  # the expiries find none
    settled(cache)
    assert names_expiring(redis_server) == {}
    cache.retention.expire(now=7.0)  # the engine's step: the lost pages are written again
    settled(cache)
    assert in_a_day(names_expiring(redis_server)) == 4

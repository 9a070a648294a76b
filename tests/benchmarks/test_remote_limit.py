"""The remote tier's limit: Redis's pipelined GET throughput on loopback, measured by redis-py
and by redis-benchmark against a real Redis, the higher of the two taken."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from benchmarks.remote_limit import redis_benchmark_get, redis_get_throughput
from tests.redis_servers import RedisServer, require_redis

VALUE_BYTES = 64 << 10


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A `redis-server` on a loopback port of its own, stopped after the test."""
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_the_limit_is_the_faster_client_on_the_replicas_values(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    for index in range(40):
        client.set(f"tieredkv:{index:04d}", os.urandom(VALUE_BYTES))
    limit = redis_get_throughput(redis_server.url, batch=8)
    assert limit["values"] == 40 and limit["bytes"] == 40 * VALUE_BYTES
    assert limit["value_bytes"] == VALUE_BYTES and limit["batch"] == 8
    assert limit["redis_py_gbps"] > 0
    if limit["redis_benchmark_gbps"] is None:
        pytest.skip("redis-benchmark is not on PATH")
    assert limit["redis_benchmark_gbps"] > 0
    assert limit["gbps"] == max(limit["redis_py_gbps"], limit["redis_benchmark_gbps"])
    # redis-benchmark's own key is its own: the replicas' values are untouched
    assert sorted(client.scan_iter(match="tieredkv:*")) == [
        f"tieredkv:{index:04d}".encode() for index in range(40)
    ]


def test_redis_benchmark_missing_or_failing_is_unknown(monkeypatch, redis_server) -> None:
    assert redis_benchmark_get("redis://127.0.0.1:1/0", VALUE_BYTES, 8, requests=16) is None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert redis_benchmark_get(redis_server.url, VALUE_BYTES, 8, requests=16) is None

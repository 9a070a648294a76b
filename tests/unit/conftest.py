"""Fixtures shared by unit tests of several packages: a real single Redis server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, require_redis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A `redis-server` on a loopback port of its own, stopped after the test."""
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()

"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, require_redis


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis of the test's own, in its temporary directory."""
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()

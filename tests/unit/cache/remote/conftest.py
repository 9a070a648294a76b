"""Fixtures of the remote store's tests: a real three-master Redis cluster (the single server,
`redis_server`, is tests/unit/conftest.py's), stores closed after each test, and chains of
bf16-sized random pages."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tests.redis_servers import RedisCluster, require_redis, start_cluster
from tieredkv.cache.index.page_key import chain_keys, namespace_root_key
from tieredkv.cache.remote.connection import RemoteTimeouts
from tieredkv.cache.remote.record import RemotePage
from tieredkv.cache.remote.store import RemoteStore

PAGE_SIZE = 16
# SmolLM2-135M in bf16: 30 layers × (K, V) × 3 KV heads × 64 dims × 16 tokens × 2 bytes
PAGE_BYTES = 30 * 2 * 3 * 64 * PAGE_SIZE * 2
FINGERPRINT = b"test-model-fingerprint"
# Functional tests must not turn degraded because a busy 2-core test machine was slow;
# the failure tests use the default budget.
RELAXED = RemoteTimeouts(lookup_s=2.0, fetch_s=2.0, backoff_min_s=0.05, backoff_max_s=0.2)
FAST_RECONNECT = RemoteTimeouts(backoff_min_s=0.05, backoff_max_s=0.2)


def make_pages(
    num_pages: int,
    namespace: str = "",
    fingerprint: bytes = FINGERPRINT,
    seed: int = 0,
    compressible: bool = False,
) -> list[RemotePage]:
    """A chain of `num_pages` pages of random tokens and random bf16-like KV bytes (half of
    each page zero when `compressible`, so lz4 has something to do)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 49152, size=num_pages * PAGE_SIZE).tolist()
    root = namespace_root_key(fingerprint, namespace)
    keys = chain_keys(root, tokens, PAGE_SIZE)
    pages = []
    for index, key in enumerate(keys):
        data = rng.integers(0, 256, size=PAGE_BYTES, dtype=np.uint8)
        if compressible:
            data[: PAGE_BYTES // 2] = 0
        parent = keys[index - 1] if index else root
        page_tokens = tuple(tokens[index * PAGE_SIZE : (index + 1) * PAGE_SIZE])
        pages.append(RemotePage(key, parent, page_tokens, data.tobytes()))
    return pages


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    require_redis()
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def open_store() -> Iterator[Callable[..., RemoteStore]]:
    """open_store(url, **kwargs): a RemoteStore for the test pages, closed at teardown."""
    stores: list[RemoteStore] = []

    def open_one(url: str, **kwargs: object) -> RemoteStore:
        options: dict = {"fingerprint": FINGERPRINT, "timeouts": RELAXED, **kwargs}
        store = RemoteStore(url, page_size=PAGE_SIZE, page_bytes=PAGE_BYTES, **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()

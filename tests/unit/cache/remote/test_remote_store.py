"""RemoteStore against real Redis, a single server and a three-master cluster: pages round
trip, lookups count leading pages in one round trip, refusals are misses counted by reason,
namespaces stay apart, a page already stored is not written again, and writes wait while a
read is in flight."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
import redis.cluster

from tests.unit.cache.remote.conftest import make_pages
from tieredkv.cache.page_record import RAW
from tieredkv.cache.remote.connection import SOCKET_READ_BYTES, RemoteTimeouts
from tieredkv.cache.remote.record import RemotePage, encode_value
from tieredkv.cache.remote.secret import StoreKeys
from tieredkv.cache.remote.store import RemoteStore

FLUSH_S = 10.0
OpenStore = Callable[..., RemoteStore]


@pytest.fixture(params=["single", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    if request.param == "single":
        return request.getfixturevalue("redis_server").url
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flush()  # one cluster serves the module's tests
    return cluster.url


def raw_client(store: RemoteStore):
    return store._client.redis  # the store's own connection, to plant values


def store_keys(store: RemoteStore) -> StoreKeys:
    return store._keys  # the keys the store seals with, to plant sealed values


def name_of(store: RemoteStore, key: bytes) -> bytes:
    return store_keys(store).name(key)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_pages_round_trip(redis_url: str, open_store: OpenStore, compression: str) -> None:
    store = open_store(redis_url, compression=compression)
    assert store.healthy
    pages = make_pages(6, seed=1, compressible=True)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    keys = [page.key for page in pages]
    assert store.lookup(keys) == 6
    assert store.fetch(keys) == [page.data for page in pages]
    counters = store.counters()
    assert (counters.writes, counters.hits, counters.misses, counters.errors) == (6, 6, 0, 0)
    assert sum(counters.refused.values()) == 0
    if compression == "lz4":
        assert counters.bytes_out < 6 * len(pages[0].data) * 0.6
    assert counters.bytes_in == counters.bytes_out


def test_lookup_counts_leading_pages_in_one_round_trip(
    redis_url: str, open_store: OpenStore
) -> None:
    store = open_store(redis_url)
    pages = make_pages(8, seed=2)
    store.put(pages[:3] + pages[4:6])  # a hole at page 3
    assert store.flush_writes(FLUSH_S)
    client = raw_client(store)
    executes = []
    real_pipeline = client.pipeline

    def counting_pipeline(*args, **kwargs):
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute
        pipe.execute = lambda *a, **k: executes.append(1) or real_execute(*a, **k)
        return pipe

    client.pipeline = counting_pipeline
    assert store.lookup([page.key for page in pages]) == 3
    assert len(executes) == 1
    assert store.lookup([page.key for page in pages[4:]]) == 2
    assert store.lookup([pages[3].key]) == 0
    assert store.lookup([]) == 0
    assert store.counters().lookups == 4


def test_refused_values_are_misses_counted_by_reason(redis_url: str, open_store: OpenStore) -> None:
    store = open_store(redis_url)
    pages = make_pages(4, seed=3)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    client = raw_client(store)
    value = bytearray(client.get(store.key_name(pages[1].key)))
    value[-7] ^= 0xFF  # a flipped payload byte
    client.set(store.key_name(pages[1].key), bytes(value))
    client.set(store.key_name(pages[2].key), client.get(store.key_name(pages[0].key)))
    client.set(store.key_name(pages[0].key), b"garbage")
    half = RemotePage(name_of(store, pages[3].key), b"", pages[3].tokens, pages[3].data[:100])
    client.set(store.key_name(pages[3].key), encode_value(half, store_keys(store), RAW))
    assert store.fetch([page.key for page in pages]) == [None] * 4
    counters = store.counters()
    assert counters.refused == {"corrupt": 1, "fingerprint": 1, "mac": 1, "key": 1}
    assert (counters.hits, counters.misses, counters.errors) == (0, 4, 0)
    assert store.healthy


def test_a_namespace_never_finds_another_namespaces_pages(
    redis_url: str, open_store: OpenStore
) -> None:
    store = open_store(redis_url)
    tenant_a = make_pages(3, namespace="tenant-a", seed=4)
    tenant_b = make_pages(3, namespace="tenant-b", seed=4)  # the same tokens
    assert [a.tokens for a in tenant_a] == [b.tokens for b in tenant_b]
    store.put(tenant_a)
    assert store.flush_writes(FLUSH_S)
    assert store.lookup([page.key for page in tenant_b]) == 0
    assert store.fetch([page.key for page in tenant_b]) == [None] * 3
    assert store.lookup([page.key for page in tenant_a]) == 3


def test_a_page_already_stored_is_not_written_again(redis_url: str, open_store: OpenStore) -> None:
    store = open_store(redis_url)
    pages = make_pages(4, seed=5)
    store.put(pages[:2])
    assert store.flush_writes(FLUSH_S)
    store.put(pages)  # two known, two new
    assert store.flush_writes(FLUSH_S)
    counters = store.counters()
    assert (counters.writes, counters.dedup_skips) == (4, 2)
    replica = open_store(redis_url)  # another replica knows nothing: EXISTS finds them
    replica.put(pages)
    assert replica.flush_writes(FLUSH_S)
    assert (replica.counters().writes, replica.counters().dedup_skips) == (0, 4)
    assert replica.fetch([page.key for page in pages]) == [page.data for page in pages]


def test_writes_wait_while_a_read_is_in_flight(redis_server, open_store: OpenStore) -> None:
    store = open_store(redis_server.url)
    store.read_priority.max_wait_s = 30.0  # the "read" below ends well before this
    pages = make_pages(3, seed=6)
    with store.read_priority.reading():  # a lookup or a fetch a request waits for
        store.put(pages)
        assert not store.flush_writes(0.5)  # held back while the read lasts
        assert store.counters().writes == 0
    assert store.flush_writes(FLUSH_S)
    assert store.counters().writes == 3
    assert store.read_priority.writes_deferred >= 1
    assert store.fetch([page.key for page in pages]) == [page.data for page in pages]


def test_a_single_server_hands_every_page_on_from_one_reused_buffer(
    redis_server, open_store
) -> None:
    """From a single Redis the replies are read off the socket into the store's one buffer and
    handed on from there, in order: no object per value."""
    store = open_store(redis_server.url)
    pages = make_pages(3, seed=7)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    buffers, got = set(), []

    def sink(index: int, data: memoryview) -> None:
        buffers.add(id(data.obj))
        got.append((index, bytes(data)))

    assert store.fetch_into([page.key for page in pages], sink) == [True] * 3
    assert got == [(index, page.data) for index, page in enumerate(pages)]
    assert len(buffers) == 1


def test_a_fetch_past_its_budget_hands_nothing_on_once_it_returns(redis_server, open_store) -> None:
    """The transfer jobs' pages are its own only until the fetch returns: a call still reading
    after its budget must not write into them. The pages handed on before count as found,
    the rest are misses, and the connection left mid-reply is never reused."""
    tight = RemoteTimeouts(fetch_s=0.05, fetch_per_mib_s=0.001, backoff_min_s=0.05)
    store = open_store(redis_server.url, timeouts=tight)
    pages = make_pages(8, seed=8)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    calls: list[int] = []

    def slow_sink(index: int, data: memoryview) -> None:
        calls.append(index)
        time.sleep(0.03)

    delivered = store.fetch_into([page.key for page in pages], slow_sink)
    handed_on = len(calls)
    time.sleep(0.5)  # the call thread reads on, or stops: either way nothing more arrives
    assert len(calls) == handed_on == sum(delivered)
    assert 0 < handed_on < len(pages) and delivered == sorted(delivered, reverse=True)
    assert store.counters().errors == 1 and store.wait_healthy(FLUSH_S)  # degraded, healed
    assert store.fetch([page.key for page in pages]) == [page.data for page in pages]


def test_an_error_reply_ends_the_fetch_there_and_the_store_heals(redis_server, open_store) -> None:
    store = open_store(redis_server.url)
    pages = make_pages(3, seed=9)
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    client = raw_client(store)
    client.delete(store.key_name(pages[1].key))
    client.rpush(store.key_name(pages[1].key), b"not a page")  # GET answers -WRONGTYPE
    assert store.fetch([page.key for page in pages]) == [pages[0].data, None, None]
    assert store.counters().errors == 1 and store.degraded
    assert store.wait_healthy(FLUSH_S)
    assert store.fetch([pages[0].key, pages[2].key]) == [pages[0].data, pages[2].data]


def test_every_connection_reads_the_socket_a_page_or_more_at_a_time(
    redis_url: str, open_store: OpenStore
) -> None:
    """The parser's read size reaches the client's connections, single server or cluster
    (redis-py's 64 KiB made a 368 KB value six reads: measured slower)."""
    store = open_store(redis_url)
    client = store._client.redis
    if isinstance(client, redis.cluster.RedisCluster):
        pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
    else:
        pools = [client.connection_pool]
    assert pools and all(
        pool.connection_kwargs["socket_read_size"] == SOCKET_READ_BYTES for pool in pools
    )

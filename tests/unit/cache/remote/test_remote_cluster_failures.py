"""A Redis Cluster that changes under the store: a master killed and restarted, slots moved
between masters while pages are read, a master added and the slots rebalanced onto it. The
store costs hits while the cluster is broken, never serves a wrong page, and finds every
page again once the cluster has settled. Each test builds its own three-master cluster."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.redis_servers import (
    CLUSTER_NODE_TIMEOUT_MS,
    RedisCluster,
    RedisServer,
    move_slots,
    require_redis,
    slots_holding_keys,
    start_cluster,
    wait_cluster_ok,
)
from tests.unit.cache.remote.conftest import RELAXED, make_pages
from tieredkv.cache.remote.store import RemoteStore

FLUSH_S = 10.0
HEAL_S = 15.0
OpenStore = Callable[..., RemoteStore]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    require_redis()
    cluster = start_cluster(tmp_path / "cluster")
    yield cluster
    cluster.stop()


def cli_cluster(*args: str) -> None:
    done = subprocess.run(["redis-cli", "--cluster", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-1000:]


def keys_per_node(cluster: RedisCluster) -> list[int]:
    return [int(node.cli("DBSIZE").strip()) for node in cluster.nodes]


def stored(store: RemoteStore, pages: list) -> None:
    store.put(pages)
    assert store.flush_writes(FLUSH_S)
    assert store.counters().writes >= len(pages)


def test_killed_master_costs_hits_then_heals(cluster: RedisCluster, open_store: OpenStore) -> None:
    """A master dies (no replicas, so the cluster goes down once the others agree): calls
    return nothing, the store says degraded and stays so while the cluster is down, even
    though the node in its URL still answers PING; the master comes back (same port, its
    nodes.conf kept, its keys lost), the store heals by itself and writes land again."""
    store = open_store(cluster.url, timeouts=RELAXED)  # the budgets are test_remote_failures'
    pages = make_pages(24, seed=30)
    stored(store, pages)
    keys = [page.key for page in pages]
    held = keys_per_node(cluster)
    assert min(held) > 0  # the chain is spread over all three masters
    victim = cluster.nodes[1]  # not the URL's node: the client found it by discovery
    victim.kill()
    cluster.nodes[0].wait_for_cluster_state("fail", CLUSTER_NODE_TIMEOUT_MS / 1000 + 10)
    assert store.lookup(keys) == 0
    assert store.fetch(keys) == [None] * len(keys)
    assert store.degraded
    assert not store.wait_healthy(1.0), "healthy again while the cluster is down"
    victim.start()
    wait_cluster_ok(cluster)
    assert store.wait_healthy(HEAL_S), store.last_error
    found = store.fetch(keys)
    assert all(got in (None, page.data) for got, page in zip(found, pages, strict=True))
    assert found.count(None) == held[1]  # the victim's pages are lost, the others' are not
    stored(store, pages)  # what was lost is written again
    assert store.lookup(keys) == len(keys)
    assert store.fetch(keys) == [page.data for page in pages]


def test_slots_moved_while_reading(cluster: RedisCluster, open_store: OpenStore) -> None:
    """Every slot holding pages on one master migrates to another (ASK while a slot moves,
    MOVED after) while a thread keeps fetching: no read returns a wrong page or fails, and
    afterwards every page is found."""
    store = open_store(cluster.url, timeouts=RELAXED)
    pages = make_pages(40, seed=31)
    stored(store, pages)
    keys = [page.key for page in pages]
    wrong: list[int] = []
    reads = 0
    done = threading.Event()

    def keep_reading() -> None:
        nonlocal reads
        while not done.is_set():
            for index, got in enumerate(store.fetch(keys)):
                if got is not None and got != pages[index].data:
                    wrong.append(index)
            reads += 1

    reader = threading.Thread(target=keep_reading)
    reader.start()
    source, target = cluster.nodes[0], cluster.nodes[2]
    try:
        move_slots(cluster, source, target, slots_holding_keys(source))
    finally:
        done.set()
        reader.join()
    assert reads > 0 and not wrong
    assert keys_per_node(cluster)[0] == 0  # the source master holds nothing now
    assert store.counters().errors == 0 and store.healthy, store.last_error
    assert store.lookup(keys) == len(keys)
    assert store.fetch(keys) == [page.data for page in pages]


def test_master_added_and_rebalanced(
    cluster: RedisCluster, tmp_path: Path, open_store: OpenStore
) -> None:
    """A fourth master joins and takes slots (and their keys) from two others: the store,
    which never heard of it, finds every page (through MOVED) and writes new ones there."""
    store = open_store(cluster.url, timeouts=RELAXED)
    pages = make_pages(40, seed=32)
    stored(store, pages)
    keys = [page.key for page in pages]
    newcomer = RedisServer(tmp_path / "node3", extra_args=cluster.node_args).start()
    cluster.nodes.append(newcomer)
    cli_cluster("add-node", f"127.0.0.1:{newcomer.port}", f"127.0.0.1:{cluster.nodes[0].port}")
    wait_cluster_ok(cluster)
    for node in cluster.nodes[:2]:  # the slots holding pages on two of the three old masters
        move_slots(cluster, node, newcomer, slots_holding_keys(node))
    wait_cluster_ok(cluster)
    assert keys_per_node(cluster)[3] > 0  # some of the pages moved to the new master
    assert store.lookup(keys) == len(keys)
    assert store.fetch(keys) == [page.data for page in pages]
    more = make_pages(40, seed=33)
    stored(store, more)
    assert store.fetch([page.key for page in more]) == [page.data for page in more]
    assert store.counters().errors == 0 and store.healthy

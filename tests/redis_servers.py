"""Real Redis servers for tests: a single server or a three-master cluster, each on loopback
ports of its own with a temporary directory and no persistence. No fake Redis anywhere. The
server itself is the benchmark's (`benchmarks.redis_server`), with test-only controls."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import redis_server as bench_redis

READY_S = 10.0  # a server or a cluster that is not up by then is a failed fixture
CLUSTER_BUS_OFFSET = 10000  # Redis Cluster's bus listens on port + 10000
CLUSTER_NODE_TIMEOUT_MS = 2000  # a master unreachable this long is marked failed


def require_redis() -> None:
    """Skip when redis-server or redis-cli is missing, except on CI (which installs them)."""
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed (apt-get install redis-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it")
    pytest.skip(message)


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port that is free, as is its cluster bus port."""
    for _ in range(200):
        port = random.randint(20000, 50000)
        if _port_free(port) and _port_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free loopback port found")


def _wait_for(check: object, what: str, timeout_s: float = READY_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout_s} s")
        time.sleep(0.02)


class RedisServer(bench_redis.RedisServer):
    """The benchmark's redis-server (start, stop, kill, start again on the same port), on a
    port whose cluster bus port is free too, with an optional password, redis-cli, a plain
    client, and SIGSTOP / SIGCONT."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        password: str | None = None,
    ) -> None:
        self.password = password
        if password is not None:
            extra_args = (*extra_args, "--requirepass", password)
        super().__init__(directory, port or free_port(), extra_args)

    def cli(self, *command: str) -> str:
        """Run one redis-cli command against this server; its output."""
        args = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port)]
        env = dict(os.environ, REDISCLI_AUTH=self.password) if self.password else None
        done = subprocess.run([*args, *command], capture_output=True, text=True, env=env)
        return done.stdout

    def client(self):
        """A plain redis-py client on this node alone (tests that steer a cluster by hand)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def wait_for_cluster_state(self, state: str, timeout_s: float = READY_S) -> None:
        """Wait until this cluster node reports `cluster_state:<state>` (ok or fail)."""
        wanted = f"cluster_state:{state}"
        _wait_for(lambda: wanted in self.cli("CLUSTER", "INFO"), wanted, timeout_s)

    def pause(self) -> None:
        """SIGSTOP: the server is there but answers nothing (a slow or hung store)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.running():
            self.resume()  # a paused server cannot act on SIGTERM
        super().stop()


@dataclass
class RedisCluster:
    """Three masters, no replicas, built with `redis-cli --cluster create`."""

    nodes: list[RedisServer]
    node_args: tuple[str, ...] = (
        "--cluster-enabled", "yes", "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
    )  # fmt: skip

    @property
    def url(self) -> str:
        return self.nodes[0].url  # any node: the client discovers the others

    def flush(self) -> None:
        for node in self.nodes:
            node.cli("FLUSHALL")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def wait_cluster_ok(cluster: RedisCluster, timeout_s: float = 2 * READY_S) -> None:
    """Wait until every node of `cluster` reports cluster_state:ok."""
    for node in cluster.nodes:
        node.wait_for_cluster_state("ok", timeout_s)


def start_cluster(directory: Path, num_masters: int = 3) -> RedisCluster:
    cluster = RedisCluster([])
    for index in range(num_masters):
        node = RedisServer(directory / f"node{index}", extra_args=cluster.node_args)
        cluster.nodes.append(node)
        node.start()
    nodes = cluster.nodes
    addresses = [f"127.0.0.1:{node.port}" for node in nodes]
    create = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0"]
    done = subprocess.run([*create, "--cluster-yes"], capture_output=True)
    if done.returncode != 0:
        cluster.stop()
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout.decode()[-500:]}")
    wait_cluster_ok(cluster, READY_S)
    return cluster


def node_id(node: RedisServer) -> str:
    return node.cli("CLUSTER", "MYID").strip()


def slots_holding_keys(node: RedisServer) -> list[int]:
    """The hash slots of every key `node` holds."""
    client = node.client()
    try:
        return sorted({client.cluster("keyslot", key) for key in client.scan_iter(count=1000)})
    finally:
        client.close()


def wait_node_known(cluster: RedisCluster, known_id: str, timeout_s: float = READY_S) -> None:
    """Wait until every node of `cluster` lists `known_id` among its peers: cluster_state:ok
    comes before gossip has told every node of a newly added one, and a node that has not heard
    of it answers `CLUSTER SETSLOT ... NODE` with "Unknown node"."""
    deadline = time.monotonic() + timeout_s
    for node in cluster.nodes:
        while known_id not in node.cli("CLUSTER", "NODES"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.port} has not heard of {known_id}")
            time.sleep(0.05)


def move_slots(cluster: RedisCluster, source: RedisServer, target: RedisServer, slots: list[int]):
    """Migrate `slots` and their keys from `source` to `target` as `redis-cli --cluster
    reshard` does (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE on every master), but only these
    slots: clients meet ASK while a slot moves and MOVED after."""
    source_id, target_id = node_id(source), node_id(target)
    wait_node_known(cluster, target_id)
    clients = {node.port: node.client() for node in cluster.nodes}
    try:
        src, dst = clients[source.port], clients[target.port]
        for slot in slots:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            for client in clients.values():
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
    finally:
        for client in clients.values():
            client.close()

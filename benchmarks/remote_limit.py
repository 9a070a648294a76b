"""The remote tier's promotion bandwidth beside its limit, both measured in the same run.

The bandwidth comes from the replicas' own counters: the bytes every replica moved out of the
remote tier (`transfer_bytes_total{from_tier="remote"}`) over the seconds its promotions from
there took (`promotion_seconds_sum{from_tier="remote"}`), summed over the replicas and over a
restarted replica's lives. The limit is loopback Redis's own pipelined GET throughput, one
connection, as many GETs a round trip as the replicas' average fetch (the remote tier's transfer job
sends one pipeline a fetch), the higher of two clients:

- redis-py (the replicas' client) reading back every value the replicas wrote;
- `redis-benchmark` (Redis's own C client) getting a value of the same size.

The C client alone is no limit where it is missing; redis-py alone reads below the replicas'
own promotions on a VM that faults in fresh memory slowly (each of its large batches lands in
freshly allocated memory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import httpx
import redis

from tieredkv.bench.prom_text import Samples, counter_delta, parse_samples, select
from tieredkv.cache.remote.connection import SOCKET_READ_BYTES

REMOTE = {"from_tier": "remote"}


def scrape(base_url: str) -> Samples:
    """A replica's /metrics (open: no key needed)."""
    return parse_samples(httpx.get(base_url + "/metrics", timeout=10).text)


def remote_writes_settled(urls: list[str], timeout_s: float = 30.0) -> bool:
    """Wait until the replicas' bytes written to the remote tier stop growing (three equal
    sums, 0.1 s apart): their writes are asynchronous, and a turn on another replica should
    find what the previous round wrote rather than race it. False past `timeout_s`."""
    sums: list[float] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = [scrape(url) for url in urls]
        sums.append(sum(sum(select(s, "tieredkv_transfer_bytes_total", to_tier="remote").values())
                        for s in samples))  # fmt: skip
        if len(sums) >= 3 and sums[-1] == sums[-2] == sums[-3]:
            return True
        time.sleep(0.1)
    return False


class RemotePromotions:
    """What the replicas' promotions from the remote tier moved and took, from this object's
    making to the last `end`. A replica stopped and started again counts twice: `end(i)` before
    it stops closes its first life, and its new process starts from zero."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._since: list[Samples] = [scrape(url) for url in urls]
        self.bytes = 0.0
        self.seconds = 0.0
        self.promotions = 0.0

    def end(self, index: int) -> None:
        """Add replica `index`'s counters since its last scrape; the next life starts at 0."""
        now = scrape(self.urls[index])
        before = self._since[index]
        self.bytes += counter_delta(before, now, "tieredkv_transfer_bytes_total", **REMOTE) or 0
        self.seconds += counter_delta(before, now, "tieredkv_promotion_seconds_sum", **REMOTE) or 0
        self.promotions += (
            counter_delta(before, now, "tieredkv_promotion_seconds_count", **REMOTE) or 0
        )
        self._since[index] = {}

    def end_all(self) -> None:
        for index in range(len(self.urls)):
            self.end(index)

    def figures(self) -> dict:
        gbps = self.bytes / self.seconds / 1e9 if self.bytes and self.seconds else None
        return {"bytes": self.bytes, "seconds": self.seconds, "promotions": self.promotions,
                "gbps": gbps}  # fmt: skip


def redis_get_throughput(url: str, promotions: dict | None = None, batch: int = 64) -> dict:
    """Pipelined GETs of every tieredkv value in the Redis at `url`, one client (redis-py with
    hiredis, the store's socket read size, and redis-benchmark's C client; the store's own
    fetches from a single Redis read the replies themselves, see cache/remote/get_replies.py):
    Redis's own read throughput on loopback for the values the replicas wrote. With `promotions`
    (`RemotePromotions.figures()`), as many GETs a round trip as an average promotion from the
    remote tier fetched; else `batch`."""
    client = redis.Redis.from_url(url, socket_read_size=SOCKET_READ_BYTES)
    value_bytes = 0.0
    try:
        keys = list(client.scan_iter(match="tieredkv:*", count=1000))
        if keys:
            sample = keys[:32]
            value_bytes = sum(client.strlen(key) for key in sample) / len(sample)
        if promotions is not None:
            batch = batch_like_the_replicas(promotions, value_bytes, batch)
        started = time.perf_counter()
        total = 0
        for start in range(0, len(keys), batch):
            pipe = client.pipeline(transaction=False)
            for key in keys[start : start + batch]:
                pipe.get(key)
            total += sum(len(value) for value in pipe.execute() if value)
        seconds = time.perf_counter() - started
    finally:
        client.close()
    python_gbps = total / seconds / 1e9 if total and seconds else None
    c_gbps = redis_benchmark_get(url, round(value_bytes), batch) if value_bytes else None
    measured = [g for g in (python_gbps, c_gbps) if g]
    return {"values": len(keys), "bytes": total, "batch": batch, "value_bytes": value_bytes,
            "redis_py_gbps": python_gbps, "redis_benchmark_gbps": c_gbps,
            "gbps": max(measured) if measured else None}  # fmt: skip


def redis_benchmark_get(url: str, value_bytes: int, batch: int, requests: int = 0) -> float | None:
    """GB/s of `redis-benchmark`'s pipelined GETs of one `value_bytes` value, one connection,
    `batch` a round trip (it SETs its own key first, `key:__rand_int__`; tieredkv's keys are
    untouched). None where redis-benchmark is not on PATH or fails."""
    tool = shutil.which("redis-benchmark")
    if tool is None or value_bytes <= 0:
        return None
    try:  # redis-benchmark retries an unreachable server for minutes
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except (redis.RedisError, OSError):
        return None
    where = redis.connection.parse_url(url)
    requests = requests or max(1000, 20 * batch)
    command = [tool, "-h", str(where.get("host", "127.0.0.1")), "-p", str(where.get("port", 6379)),
               "--dbnum", str(where.get("db", 0)), "-c", "1", "-P", str(batch), "-t", "set,get",
               "-d", str(value_bytes), "-n", str(requests), "--csv"]  # fmt: skip
    env = None  # the password, where the URL has one, by environment: never on a command line
    if where.get("password"):
        env = dict(os.environ, REDISCLI_AUTH=str(where["password"]))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        fields = [field.strip('"') for field in line.split(",")]
        if fields[0] == "GET" and len(fields) > 1:
            try:
                return float(fields[1]) * value_bytes / 1e9
            except ValueError:
                return None
    return None


def batch_like_the_replicas(promotions: dict, value_bytes: float, default: int) -> int:
    """GETs per round trip: the values an average promotion from the remote tier fetched."""
    if not promotions["promotions"] or not value_bytes:
        return default
    return max(1, round(promotions["bytes"] / promotions["promotions"] / value_bytes))

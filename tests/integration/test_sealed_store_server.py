"""Real `tieredkv serve` replicas (a tiny random Llama) sharing a real Redis with a secret:
values hold no token id; a forged value (header kept, payload zeroed, its MAC recomputed as
far as one can without the secret) and a value copied under another page's key are not served
(counted by reason), while untouched values are; a replica with another secret finds nothing."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np

from tests.integration.server_process import ServerProcess
from tests.model_factory import make_tiny_model_dir
from tests.redis_servers import RedisServer
from tieredkv.bench.prom_text import parse_samples, select
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.remote.record import HEADER_BYTES
from tieredkv.cache.remote.secret import SECRET_ENV, StoreKeys

PAGE_SIZE = 16
PROMPT_PAGES = 5
WRITE_WAIT_S = 60.0


def serve(model: Path, redis: RedisServer, log: Path, secret: str) -> ServerProcess:
    args = ["--model", str(model), "--dtype", "float32", "--device-cache-size", "4MiB"]
    args += ["--host-cache-size", "0", "--remote-cache-url", redis.url]
    args += ["--remote-budget-scale", "20"]  # a busy test machine must not turn it degraded
    return ServerProcess(args, log, env={SECRET_ENV: secret})


def prompt_of(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, 320, size=PROMPT_PAGES * PAGE_SIZE).tolist()


def remote_tokens(server: ServerProcess, prompt: list[int]) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    reply = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["remote"]


def refused(server: ServerProcess, reason: str) -> float:
    samples = parse_samples(httpx.get(server.base_url + "/metrics", timeout=30).text)
    return sum(select(samples, "tieredkv_remote_page_errors_total", reason=reason).values())


def keys_written(redis: RedisServer, before: set[bytes], count: int) -> list[bytes]:
    """The value keys that appear in Redis past `before`, once there are `count` of them."""
    deadline = time.monotonic() + WRITE_WAIT_S
    with redis.client() as client:
        while True:
            new = set(client.keys(KEY_PREFIX + "*")) - before
            if len(new) >= count:
                return sorted(new)
            assert time.monotonic() < deadline, f"{len(new)} of {count} pages written"
            time.sleep(0.1)  # test code: the writer thread writes in the background


def test_forged_replayed_and_foreign_values_are_not_served(redis, tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "model", name="tiny")
    forged_prompt, replayed_prompt, kept_prompt = prompt_of(1), prompt_of(2), prompt_of(3)
    writer = serve(model, redis, tmp_path / "writer.log", "the-replicas-secret-0123456789")
    written: dict[int, list[bytes]] = {}
    try:
        seen: set[bytes] = set()
        for seed, prompt in ((1, forged_prompt), (2, replayed_prompt), (3, kept_prompt)):
            assert remote_tokens(writer, prompt) == 0
            written[seed] = keys_written(redis, seen, PROMPT_PAGES)
            seen.update(written[seed])
    finally:
        writer.stop()
    with redis.client() as client:
        values = {key: client.get(key) for key in seen}
        for seed, prompt in ((1, forged_prompt), (2, replayed_prompt), (3, kept_prompt)):
            packed = np.asarray(prompt, dtype="<i4").tobytes()
            for start in range(0, len(packed) - 32 + 1, 4):  # any 8 consecutive tokens
                window = packed[start : start + 32]
                assert not any(window in value for value in values.values()), (seed, start)
        unsealed = StoreKeys(b"", b"")  # what a writer without the secret can compute
        for key in written[1]:
            value = bytearray(values[key])
            value[HEADER_BYTES:] = bytes(len(value) - HEADER_BYTES)
            value[32:HEADER_BYTES] = unsealed.mac(value[:32], value[HEADER_BYTES:])
            client.set(key, bytes(value))
        for target, source in zip(written[2], written[3], strict=True):
            client.set(target, values[source])  # authentic values, under other pages' keys
    reader = serve(model, redis, tmp_path / "reader.log", "the-replicas-secret-0123456789")
    try:
        assert remote_tokens(reader, forged_prompt) == 0
        assert refused(reader, "mac") >= 1
        assert remote_tokens(reader, replayed_prompt) == 0
        assert refused(reader, "key") >= 1
        assert remote_tokens(reader, kept_prompt) == (PROMPT_PAGES - 1) * PAGE_SIZE
    finally:
        reader.stop()
    foreign = serve(model, redis, tmp_path / "foreign.log", "another-deployments-secret-987")
    try:
        assert remote_tokens(foreign, kept_prompt) == 0  # its names are not these
        assert refused(foreign, "mac") == refused(foreign, "key") == 0
    finally:
        foreign.stop()

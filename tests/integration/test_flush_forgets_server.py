"""A flush forgets everywhere, through real `tieredkv serve` replicas (a tiny random Llama)
sharing a real Redis: after a tenant's flush, and after an admin's, the same prompt gets no
cached token from any tier (device, host, disk, remote) on the replica that flushed, after its
restart (its disk re-indexed before the flush), and on another replica that held the prompt
on its own device and found it in Redis before."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import numpy as np

from tests.integration.server_process import ServerProcess
from tests.model_factory import make_tiny_model_dir
from tests.redis_servers import RedisServer
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.remote.shared_generations import POLL_S

KEYS = {"alice": "sk-alice-7d1e0a2b3c", "bob": "sk-bob-2c9a4d5e6f", "ops": "sk-ops-5b3f8a9b0c"}
ROLES = {"alice": "tenant", "bob": "tenant", "ops": "admin"}
PAGE_SIZE = 16
PROMPT_PAGES = 5
HTTP = httpx.Client(timeout=120.0)


def serve(model: Path, redis: RedisServer, root: Path, name: str, disk: bool) -> ServerProcess:
    keys = root / "keys"
    keys.write_text("".join(f"{KEYS[who]} {who} {ROLES[who]}\n" for who in KEYS))
    os.chmod(keys, 0o600)
    args = ["--model", str(model), "--dtype", "float32", "--api-keys-file", str(keys)]
    args += ["--device-cache-size", "4MiB", "--host-cache-size", "1MiB"]
    args += [*redis.serve_flags(), "--remote-budget-scale", "20"]
    if disk:
        args += ["--disk-cache-dir", str(root / "kv"), "--disk-cache-size", "16MiB"]
    return ServerProcess(args, root / f"{name}.log")


def prompt_of(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 320, size=PROMPT_PAGES * PAGE_SIZE).tolist()


def cached(server: ServerProcess, who: str, prompt: list[int]) -> dict[str, int]:
    """The prompt's cached tokens by tier."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    reply = HTTP.post(server.base_url + "/v1/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]


def flush(server: ServerProcess, who: str) -> None:
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    reply = HTTP.post(server.base_url + "/v1/cache/flush", headers=headers)
    assert reply.status_code == 200, reply.text


def wait_for_values(redis: RedisServer, count: int) -> None:
    deadline = time.monotonic() + 60
    with redis.client() as client:
        while len(client.keys(KEY_PREFIX + "*")) < count:
            assert time.monotonic() < deadline, "the pages never reached Redis"
            time.sleep(0.1)  # test code: the writer thread writes in the background


def test_flushed_prompts_are_served_from_no_tier_on_any_replica(redis, tmp_path: Path) -> None:
    """Each prompt is asked once after a flush: asking computes it again, in the namespace's
    new generation, and the replicas share those pages as any others."""
    model = make_tiny_model_dir(tmp_path / "model", name="tiny")
    alice = [prompt_of(1), prompt_of(2)]
    bob = [prompt_of(3), prompt_of(4)]
    reused = (PROMPT_PAGES - 1) * PAGE_SIZE  # a match reuses at most all tokens but the last
    nothing = dict.fromkeys(("device", "host", "disk", "remote"), 0)
    first = serve(model, redis, tmp_path, "first", disk=True)
    second = serve(model, redis, tmp_path, "second", disk=False)
    try:
        for who, prompts in (("alice", alice), ("bob", bob)):
            assert [sum(cached(first, who, p).values()) for p in prompts] == [0, 0]
        wait_for_values(redis, 4 * PROMPT_PAGES)
        for prompt in alice:  # found in Redis, then on the second replica's own device
            assert cached(second, "alice", prompt)["remote"] == reused
        first.stop()
        first = serve(model, redis, tmp_path, "first-again", disk=True)
        flush(first, "alice")  # before any request names alice's namespace again
        assert cached(first, "alice", alice[0]) == nothing  # its disk held it before
        assert cached(first, "bob", bob[0])["disk"] == reused  # another tenant's pages stay
        time.sleep(3 * POLL_S)  # test code: the other replica reads the generations each POLL_S
        assert cached(second, "alice", alice[1]) == nothing  # its device and Redis held it
        assert cached(second, "bob", bob[1])["remote"] == reused
        flush(second, "ops")  # an admin's flush: every namespace, on every replica
        time.sleep(3 * POLL_S)
        assert cached(first, "bob", bob[0]) == nothing  # its device, host and disk held it
        assert cached(second, "bob", bob[1]) == nothing  # its device and Redis held it
    finally:
        first.stop()
        second.stop()

"""The engine's health is the server's health (issue #14): when the engine thread dies, waiting
requests fail at once with a generic error (no exception text reaches a client), /health turns
503, the process exits non-zero after the drain, and the disk store reopens cleanly."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx

from tests.reliability.harness import COMMON, MODEL, TINY_TIERS, FaultServer, disk_args, opening


def _chat(server: FaultServer, seed: int, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": opening(seed, 60), "max_tokens": max_tokens}
    return server.post("/v1/chat/completions", {**body, "temperature": 0, "ignore_eos": True})


def test_a_dead_engine_fails_requests_turns_health_503_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    kv = tmp_path / "kv"
    args = [*COMMON, *TINY_TIERS, *disk_args(kv, "64MiB"), "--max-num-seqs", "1"]
    server = FaultServer(args, tmp_path / "dying.log", {"kill_engine_after_steps": 40})
    served = _chat(server, seed=0, max_tokens=4)  # a few steps: served, pages stored
    assert served.status_code == 200
    # 3 x 64 steps at one running sequence: the engine dies while one runs and two wait
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda seed: _chat(server, seed, 64), (1, 2, 3)))
    for reply in replies:
        assert reply.status_code in (200, 503), reply.text
        assert "secret-detail" not in reply.text and "injected" not in reply.text
        if reply.status_code == 200:  # it had started: the error is in the body
            assert reply.json()["choices"][0]["finish_reason"] in ("error", "abort")
    assert any(reply.status_code == 503 for reply in replies)
    health = httpx.get(server.base_url + "/health", timeout=30)
    assert health.status_code == 503 and health.json()["engine"] == "dead"
    assert server.wait_dead(timeout=60) == 1
    assert "the engine thread died" in server.full_log()
    # the store the dead engine closed reopens: the first chat's pages are found on disk
    restarted = FaultServer(args, tmp_path / "restarted.log")
    try:
        again = _chat(restarted, seed=0, max_tokens=4)
        assert (
            again.status_code == 200
            and again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        )
        assert again.json()["choices"][0]["message"] == served.json()["choices"][0]["message"]
    finally:
        restarted.stop()

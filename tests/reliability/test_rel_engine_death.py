"""The engine's health is the server's health: when the engine thread dies, the request it is
running ends in-band with a generic error, a request waiting behind it and one arriving after
the death get a 503 (no exception text reaches a client), /health turns 503, the process exits
non-zero after the drain, and the disk store reopens cleanly."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import httpx

from tests.reliability.harness import COMMON, MODEL, TINY_TIERS, FaultServer, disk_args, opening

# Engine steps counted from the start of serving before the next one raises: more than the
# idle host-tier prefault (at most 32 chunks of the 8 MiB host tier) and the first chat take,
# far fewer than the running request needs, and enough for the waiting one to be queued.
DEATH_STEP = 150
RUNNING_TOKENS = 400
UNAVAILABLE = "the engine is not available: "
SECRETS = ("secret-detail", "injected")


def _body(seed: int, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": opening(seed, 60),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def _chat(server: FaultServer, seed: int, max_tokens: int) -> httpx.Response:
    return server.post("/v1/chat/completions", _body(seed, max_tokens))


def _stream(server: FaultServer, seed: int, started: threading.Event) -> tuple[int, list]:
    """A streamed chat: its status and its events (dicts, then "[DONE]"); `started` is set at
    the first content chunk."""
    body = {**_body(seed, RUNNING_TOKENS), "stream": True}
    events: list = []
    url = server.base_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
            if _content(events[-1]):
                started.set()
    started.set()  # also when it ended without content: the test then fails on its events
    return response.status_code, events


def _content(event: dict | str) -> str:
    if isinstance(event, str) or not event.get("choices"):
        return ""
    return event["choices"][0]["delta"].get("content") or ""


def _waiting(server: FaultServer) -> float:
    return server.metrics()["requests_waiting"]


def _assert_unavailable(reply: httpx.Response, reason: str) -> None:
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "service_unavailable" and error["message"] == UNAVAILABLE + reason


def test_a_dead_engine_fails_requests_turns_health_503_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    kv = tmp_path / "kv"
    args = [*COMMON, *TINY_TIERS, *disk_args(kv, "64MiB"), "--max-num-seqs", "1"]
    server = FaultServer(args, tmp_path / "dying.log", {"kill_engine_after_steps": DEATH_STEP})
    served = _chat(server, seed=0, max_tokens=4)  # a few steps: served, pages stored
    assert served.status_code == 200
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = pool.submit(_stream, server, 1, started)
        assert started.wait(120)
        waiting = pool.submit(_chat, server, 2, 8)  # one running sequence: this one queues
        deadline = time.monotonic() + 60
        while _waiting(server) != 1:
            assert time.monotonic() < deadline and not running.done(), "never queued"
            time.sleep(0.05)  # test code: waiting for the server's next step
        status, events = running.result()
        queued = waiting.result()
    late = _chat(server, seed=3, max_tokens=8)  # the engine is dead by now

    # the running request: its stream had started, so the error comes in-band, then [DONE]
    assert status == 200 and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "service_unavailable"
    assert error["message"] == UNAVAILABLE + "the engine stopped"
    tokens = [_content(event) for event in events[:-2]]
    assert 0 < sum(map(bool, tokens)) < RUNNING_TOKENS
    assert all(event["choices"][0]["finish_reason"] is None for event in events[:-2])
    _assert_unavailable(queued, "the engine stopped")  # failed when the engine died
    _assert_unavailable(late, "the engine is not accepting requests")  # refused at once
    for text in (json.dumps(events), queued.text, late.text):
        assert not any(secret in text for secret in SECRETS)

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

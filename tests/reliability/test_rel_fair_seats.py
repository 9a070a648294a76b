"""Bounded work and fair tenants in the batch, through the real engine and app under uvicorn
(a tiny random Llama, two tenant keys, 8 seats, at most 6,400 tokens a request): a request
that could generate more is refused; while one tenant's request runs 32 sequences of 200
tokens, another tenant's 4-token request joins at once and ends long before any of them, never
preempted; with seats taken oldest first it waited for all 32."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.live_engine import TINY_NAME, live_server, tiny_llama
from tieredkv.config import CacheConfig, KeyGrant, ServerConfig
from tieredkv.model.loader import LoadedModel

KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdef"}
SEATS = 8  # --max-num-seqs
WIDE_N, WIDE_TOKENS = 32, 200
CONFIG = ServerConfig(
    api_keys={key: KeyGrant(name, admin=False) for name, key in KEYS.items()},
    max_request_tokens=WIDE_N * WIDE_TOKENS,
)
PATIENCE_S = 300.0  # how long a client waits for an answer (not a timing check)


# fp32 pages of the tiny Llama: 8 KiB. 8 MiB hold all 32 of the wide request's sequences; in
# 512 KiB (64 pages) its sequences preempt one another once the running ones are ~80 tokens in
ROOMY = CacheConfig(device_cache_bytes=8 << 20, host_cache_bytes=0)
CRAMPED = CacheConfig(device_cache_bytes=512 << 10, host_cache_bytes=0)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return tiny_llama(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def live(model: LoadedModel) -> Iterator[str]:
    with live_server(model, CONFIG, max_num_seqs=SEATS, cache=ROOMY) as base_url:
        yield base_url


@pytest.fixture(params=[ROOMY, CRAMPED], ids=["roomy", "cramped"])
def contended(request: pytest.FixtureRequest, model: LoadedModel) -> Iterator[tuple[str, bool]]:
    """A server's base URL, and whether its device is too small for the wide request."""
    with live_server(model, CONFIG, max_num_seqs=SEATS, cache=request.param) as base_url:
        yield base_url, request.param is CRAMPED


def _chat(who: str, max_tokens: int, **extra: object) -> tuple[dict, dict]:
    body = {
        "model": TINY_NAME,
        "messages": [{"role": "user", "content": f"hi from {who}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }
    return body, {"Authorization": f"Bearer {KEYS[who]}"}


def _preemptions(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The scheduler's "preempting ID at N tokens" lines so far."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("preempting")]


class WideStream:
    """Alice's streamed request with many choices, read in a thread: the choices that have
    finished so far, and an event set once her first content arrives (her forks exist)."""

    def __init__(self, base_url: str) -> None:
        self.finished: set[int] = set()
        self.started = threading.Event()
        self.stop = threading.Event()
        self._lock = threading.Lock()
        body, headers = _chat("alice", WIDE_TOKENS, n=WIDE_N, stream=True)
        self._thread = threading.Thread(target=self._read, args=(base_url, body, headers))
        self._thread.start()

    def _read(self, base_url: str, body: dict, headers: dict) -> None:
        url = f"{base_url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=PATIENCE_S) as reply:
            for line in reply.iter_lines():
                if self.stop.is_set():
                    return  # hanging up aborts the rest
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line.removeprefix("data: ")).get("choices", []):
                    if choice["delta"].get("content"):
                        self.started.set()
                    if choice.get("finish_reason"):
                        with self._lock:
                            self.finished.add(choice["index"])

    def finished_count(self) -> int:
        with self._lock:
            return len(self.finished)

    def close(self) -> None:
        self.stop.set()
        self._thread.join()


def test_a_short_request_is_not_queued_behind_another_tenants_many_choices(
    contended: tuple[str, bool], caplog: pytest.LogCaptureFixture
) -> None:
    live, cramped = contended
    caplog.set_level(logging.INFO, logger="tieredkv.engine.scheduler")
    wide = WideStream(live)
    try:
        assert wide.started.wait(PATIENCE_S), "alice's request never started"
        deadline = time.monotonic() + PATIENCE_S
        while cramped and not _preemptions(caplog):  # bob arrives once the device is full
            assert time.monotonic() < deadline, "alice's sequences never filled the device"
            time.sleep(0.01)  # test code: waiting for the engine
        body, headers = _chat("bob", 4)
        reply = httpx.post(
            f"{live}/v1/chat/completions", json=body, headers=headers, timeout=PATIENCE_S
        )
        alice_done = wide.finished_count()
    finally:
        wide.close()
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["usage"]["completion_tokens"] == 4
    # bob's request ran beside alice's sequences: none of hers had reached its length
    assert alice_done == 0, alice_done
    preempted = _preemptions(caplog)
    assert not [m for m in preempted if answer["id"] in m], preempted  # bob never gave way


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("chat/completions", {"n": WIDE_N, "max_tokens": WIDE_TOKENS + 1}),
        ("completions", {"n": 1, "best_of": WIDE_N + 1, "max_tokens": WIDE_TOKENS}),
    ],
)
def test_a_request_over_the_token_bound_is_refused(live: str, path: str, fields: dict) -> None:
    if path == "completions":
        body = {"model": TINY_NAME, "prompt": "hi", **fields}
    else:
        body = {"model": TINY_NAME, "messages": [{"role": "user", "content": "hi"}], **fields}
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    reply = httpx.post(f"{live}/v1/{path}", json=body, headers=headers, timeout=PATIENCE_S)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("request_tokens_exceeded", "max_tokens")
    assert "at most 6400" in error["message"], error["message"]


def test_an_omitted_max_tokens_is_cut_to_the_bound(live: str) -> None:
    body, headers = _chat("alice", 1, n=128)
    del body["max_tokens"]  # the rest of the context would be ~500 tokens a choice
    reply = httpx.post(
        f"{live}/v1/chat/completions", json=body, headers=headers, timeout=PATIENCE_S
    )
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert len(answer["choices"]) == 128
    assert answer["usage"]["completion_tokens"] == 128 * 50  # 6,400 / 128 each

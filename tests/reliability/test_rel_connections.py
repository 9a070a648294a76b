"""Slow and stuck clients (issue #14): half-sent headers, a body that never finishes, a stream
nobody reads, more connections than allowed. Each is cut off within its bound, and a normal
client is still served. The server runs under uvicorn as `tieredkv serve` runs it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tieredkv.server.app import create_app

from tests.unit.server.conftest import MODEL_NAME, serve, tiny_chat_tokenizer
from tests.unit.server.fake_engine import FakeEngine
from tieredkv.config import ServerConfig

LIMITS = ServerConfig(
    max_connections=8, header_timeout_s=1.0, body_timeout_s=1.0, stall_timeout_s=1.0
)
PATIENCE_S = 30.0  # how long a test waits for something that must happen (not a timing check)
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
def engine(tmp_path: Path) -> FakeEngine:
    return FakeEngine(tiny_chat_tokenizer(tmp_path))


@pytest.fixture
def live(engine: FakeEngine) -> Iterator[str]:
    app = create_app(engine, engine.tokenizer, LIMITS, MODEL_NAME, 1 << 20)
    with serve(app, LIMITS) as base_url:
        yield base_url


def _connect(base_url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(PATIENCE_S)
    sock.connect((host, int(port)))
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _normal_request(base_url: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", json=CHAT, timeout=PATIENCE_S)


def test_half_sent_headers_are_cut_off_and_a_normal_client_is_served(live: str) -> None:
    slow = [_connect(live) for _ in range(6)]
    for sock in slow:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    reply = _normal_request(live)  # served beside the slow connections
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    for sock in slow:  # each is answered 408 and closed once its header time is up
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        sock.close()
    assert _normal_request(live).status_code == 200


def test_a_connection_that_sends_nothing_is_closed(live: str) -> None:
    sock = _connect(live)
    assert _read_all(sock).startswith(b"HTTP/1.1 408 ")
    sock.close()


def test_connections_over_the_limit_are_refused_and_slots_come_back(live: str) -> None:
    held = [_connect(live) for _ in range(LIMITS.max_connections)]
    extra = _connect(live)
    assert _read_all(extra).startswith(b"HTTP/1.1 503 ")  # refused at once, not held
    extra.close()
    for sock in held:
        sock.close()
    assert _normal_request(live).status_code == 200  # closed slots are free again


def test_a_body_that_never_finishes_gets_408(live: str) -> None:
    sock = _connect(live)
    body = json.dumps(CHAT).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:10])
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"


def test_a_stream_nobody_reads_is_dropped_and_its_request_ends(
    live: str, engine: FakeEngine
) -> None:
    engine.reply = "Hello there, the cache is warm! " * 20000  # megabytes of events
    request = {**CHAT, "stream": True, "max_tokens": 1 << 19}
    body = json.dumps(request).encode()
    sock = _connect(live, rcvbuf=4096)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)  # and never read
    assert engine.closed_event.wait(PATIENCE_S), "the engine's stream was never closed"
    assert len(engine.closed_early) == 1
    sock.close()
    assert _normal_request(live).status_code == 200

"""Slow and stuck clients: half-sent headers, a body that never finishes, a stream nobody
reads, more connections than allowed. Each is cut off within its bound, and a normal client is
still served. The real engine (a tiny random Llama) and app run under uvicorn as `tieredkv
serve` runs them, with 1 s bounds (`ServerConfig` fields no flag sets)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reliability.harness import parse_metrics
from tests.reliability.live_engine import TINY_NAME, live_server, tiny_llama
from tieredkv.config import ServerConfig
from tieredkv.model.loader import LoadedModel

LIMITS = ServerConfig(
    max_connections=8, header_timeout_s=1.0, body_timeout_s=1.0, stall_timeout_s=1.0
)
PATIENCE_S = 30.0  # how long a test waits for something that must happen (not a timing check)
# how long a client waits for the server's close after a 408: well under uvicorn's keep-alive
# handling, which would otherwise hold the connection
CLOSE_PATIENCE_S = 4.0
CHAT = {
    "model": TINY_NAME,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return tiny_llama(tmp_path_factory.mktemp("model"))


@pytest.fixture
def live(model: LoadedModel) -> Iterator[str]:
    with live_server(model, LIMITS) as base_url:
        yield base_url


@pytest.fixture
def live_quick_stall(model: LoadedModel) -> Iterator[str]:
    """A server that drops a stalled reader after 0.25 s: well before the engine could run the
    unread stream's request to its end (about 2 s here), even when the kernel's send buffers take
    the first megabytes of it."""
    with live_server(model, dataclasses.replace(LIMITS, stall_timeout_s=0.25)) as base_url:
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


def _served(reply: httpx.Response) -> bool:
    """A 200 whose answer the engine generated: all five tokens."""
    return reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 5


def _finished(base_url: str) -> dict[str, float]:
    """`request_success_total` by finished_reason."""
    metrics = parse_metrics(httpx.get(f"{base_url}/metrics", timeout=PATIENCE_S).text)
    return {
        reason: metrics[f'request_success_total{{finished_reason="{reason}"}}']
        for reason in ("stop", "length", "abort")
    }


def test_half_sent_headers_are_cut_off_and_a_normal_client_is_served(live: str) -> None:
    slow = [_connect(live) for _ in range(6)]
    for sock in slow:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    assert _served(_normal_request(live))  # served beside the slow connections
    for sock in slow:  # each is answered 408 and closed once its header time is up
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        sock.close()
    assert _served(_normal_request(live))


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
    assert _served(_normal_request(live))  # closed slots are free again


def test_a_body_that_never_finishes_gets_408_and_the_connection_closes(live: str) -> None:
    sock = _connect(live)
    body = json.dumps(CHAT).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:10])
    # the whole answer, then the server's close (b"" from recv) while the client keeps its
    # side open: no keep-alive wait on a connection whose body never came
    sock.settimeout(CLOSE_PATIENCE_S)
    answer = _read_all(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"\r\nconnection: close\r\n" in answer.split(b"\r\n\r\n", 1)[0].lower()
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"


def test_a_stream_nobody_reads_is_dropped_and_its_request_ends(live_quick_stall: str) -> None:
    live = live_quick_stall
    # 16 choices x 400 tokens, each event with 20 top logprobs: about 10 MB of events, far
    # more than the socket buffers hold
    request = {**CHAT, "stream": True, "n": 16, "max_tokens": 400}
    request |= {"logprobs": True, "top_logprobs": 20}
    body = json.dumps(request).encode()
    before = _finished(live)
    sock = _connect(live, rcvbuf=4096)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)  # and never read
    deadline = time.monotonic() + PATIENCE_S
    while _finished(live) == before:
        assert time.monotonic() < deadline, "the unread request never ended"
        time.sleep(0.05)  # test code: waiting for the server to give up on the reader
    after = _finished(live)
    assert after["abort"] == before["abort"] + 1  # aborted, not run to its end
    assert after["length"] == before["length"] and after["stop"] == before["stop"]
    sock.close()
    assert _served(_normal_request(live))


CHOICES = 4


def _tokens_generated(base_url: str) -> float:
    metrics = parse_metrics(httpx.get(f"{base_url}/metrics", timeout=PATIENCE_S).text)
    return metrics["generation_tokens_total"]


def test_a_small_stream_nobody_reads_is_dropped_though_the_buffers_hold_it(
    live_quick_stall: str,
) -> None:
    """Four choices of a few hundred tokens: a few hundred kB of events, which the kernel's
    buffers take whole, so no send ever blocks; the unacknowledged output still ends it."""
    live = live_quick_stall
    request = {**CHAT, "stream": True, "n": CHOICES, "max_tokens": 480}
    body = json.dumps(request).encode()
    before, tokens_before = _finished(live), _tokens_generated(live)
    sock = _connect(live, rcvbuf=4096)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)  # and never read
    deadline = time.monotonic() + PATIENCE_S
    while _finished(live) == before:
        assert time.monotonic() < deadline, "the unread request never ended"
        time.sleep(0.05)  # test code: waiting for the server to give up on the reader
    after = _finished(live)
    assert after["abort"] == before["abort"] + 1  # aborted, not run to its end
    assert after["length"] == before["length"] and after["stop"] == before["stop"]
    generated = _tokens_generated(live) - tokens_before
    assert generated < CHOICES * 480, generated  # generation stopped short of the request's length
    with pytest.raises(ConnectionResetError):  # the server reset the connection
        while sock.recv(65536):
            pass
    sock.close()
    assert _served(_normal_request(live))
    assert _tokens_generated(live) - tokens_before == generated + 5  # only the normal request

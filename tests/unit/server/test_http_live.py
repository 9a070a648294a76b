"""The app under uvicorn on an ephemeral port: the official openai client, and clients that
hang up (the engine's iterator must be closed, which aborts the request)."""

import json
import socket
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.unit.server.conftest import MODEL_NAME, make_app, serve
from tests.unit.server.fake_engine import REPLY

HELLO = [{"role": "user", "content": "hello world"}]


@pytest.fixture
def live(engine):
    app = make_app(engine, api_key="k3y")
    with serve(app) as base_url:
        yield base_url
    assert app.state.internal_errors == 0


def test_the_openai_client_non_streamed_and_streamed(live, engine):
    client = openai.OpenAI(base_url=live + "/v1", api_key="k3y", max_retries=0)
    completion = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=64)
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens_details.cached_tokens == 48
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        engine.reply_ids()
    )
    raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=HELLO)
    usage = json.loads(raw.http_response.text)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens_by_tier"] == {
        "device": 16,
        "host": 32,
        "disk": 0,
        "remote": 0,
    }
    text_completion = client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=5)
    assert text_completion.choices[0].text == engine.tokenizer.decode(engine.reply_ids()[:5])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=10**6)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live + "/v1", api_key="bad", max_retries=0).models.list()


def test_a_client_hanging_up_mid_stream_closes_the_engine_stream(live, engine):
    engine.stall_after = 3
    headers = {"Authorization": "Bearer k3y"}
    body = {"messages": HELLO, "stream": True}
    with (
        httpx.Client(base_url=live) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # the connection is closed; the server notices and closes the engine's iterator
    assert engine.closed_event.wait(timeout=30)
    assert engine.closed_early == [engine.requests[0].request_id]


def test_a_client_hanging_up_before_a_full_response_closes_the_engine_stream(live, engine):
    engine.stall_after = 2
    url = urlsplit(live)
    payload = json.dumps({"messages": HELLO}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(payload)).encode()
        + b"\r\n\r\n"
        + payload
    )
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(request)
        while not engine.requests:  # the request reached the engine
            engine.closed_event.wait(timeout=0.01)
    assert engine.closed_event.wait(timeout=30)
    assert engine.closed_early == [engine.requests[0].request_id]


def test_invalid_utf8_namespace_header_over_the_wire(live, engine):
    headers = {"Authorization": "Bearer k3y", "X-Cache-Namespace": b"\xff\xfe"}
    with httpx.Client(base_url=live) as client:
        response = client.post("/v1/completions", json={"prompt": "hi"}, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-Cache-Namespace"
    assert engine.requests == []


def test_a_chunked_body_over_the_limit_is_413_over_the_wire(engine):
    app = make_app(engine, max_request_bytes=4096)
    body = json.dumps({"prompt": "x" * 20000}).encode()

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    with serve(app) as base_url, httpx.Client(base_url=base_url) as client:
        response = client.post("/v1/completions", content=chunks())
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "request_too_large"
        small = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
        assert client.post("/v1/completions", content=iter([small])).status_code == 200
    assert len(engine.requests) == 1 and app.state.internal_errors == 0

"""Every bad input is a 4xx in OpenAI's error shape, never FastAPI's 422 nor a 500 (the client
fixture fails a test whose request reached the catch-all handler)."""

import json

import pytest
from fastapi.testclient import TestClient
from tieredkv.server.errors import APIError
from tieredkv.server.generation_inputs import resolve_namespace

from tests.unit.server.conftest import MAX_MODEL_LEN, MODEL_NAME, make_app
from tieredkv.engine.protocol import FinishReason

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hello world"}]


def assert_error(response, status, param=None, code=None, type_="invalid_request_error"):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == type_
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


RAW_BODIES = {
    "malformed": b'{"messages": [',
    "invalid_utf8": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "lone_surrogate": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "deep_nesting": b'{"messages": [], "x": ' + b"[" * 10000 + b"]" * 10000 + b"}",
    "not_an_object": b"[1, 2, 3]",
    "empty": b"",
    "nan": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    "huge_float": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
}


@pytest.mark.parametrize("name", sorted(RAW_BODIES))
def test_unparseable_bodies_are_400(client, name):
    response = client.post(
        CHAT, content=RAW_BODIES[name], headers={"Content-Type": "application/json"}
    )
    assert_error(response, 400)


BAD_CHAT_FIELDS = [
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user"}], "max_tokens": "10"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "messages[0].content",
    ),
    ({"messages": HELLO, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "max_tokens": 1.5}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": -5}, "max_tokens"),
    ({"messages": HELLO, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": HELLO, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "temperature": 1000}, "temperature"),
    ({"messages": HELLO, "temperature": 5}, "temperature"),  # OpenAI's range is 0 to 2
    ({"messages": HELLO, "temperature": 2.01}, "temperature"),
    ({"messages": HELLO, "top_p": 0}, "top_p"),
    ({"messages": HELLO, "top_p": 1.5}, "top_p"),
    ({"messages": HELLO, "top_k": -2}, "top_k"),
    ({"messages": HELLO, "min_tokens": -1}, "min_tokens"),
    ({"messages": HELLO, "min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"messages": HELLO, "seed": 2**70}, "seed"),
    ({"messages": HELLO, "seed": "7"}, "seed"),
    ({"messages": HELLO, "stop": 5}, "stop"),
    ({"messages": HELLO, "stop": [""]}, "stop"),
    ({"messages": HELLO, "stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"messages": HELLO, "stop_token_ids": [10**30]}, "stop_token_ids"),
    (
        {"messages": HELLO, "stream_options": {"include_usage": "yes"}},
        "stream_options.include_usage",
    ),
    ({"messages": HELLO, "cache_salt": 5}, "cache_salt"),
    ({"messages": HELLO, "n": 0}, "n"),
    ({"messages": HELLO, "n": 129}, "n"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": HELLO, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": HELLO, "logprobs": "yes"}, "logprobs"),
    ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": HELLO, "logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"5": 101.0}}, "logit_bias"),
    ({"messages": HELLO, "presence_penalty": 2.5}, "presence_penalty"),
    ({"messages": HELLO, "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": MODEL_NAME}, "messages"),
]


@pytest.mark.parametrize(("payload", "param"), BAD_CHAT_FIELDS)
def test_bad_chat_fields_are_400_naming_the_field(client, engine, payload, param):
    assert_error(client.post(CHAT, json=payload), 400, param)
    assert engine.requests == []


BAD_COMPLETION_FIELDS = [
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": [[1, 2], [3]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, -3]}, "prompt"),
    ({"prompt": [1, 10**12]}, "prompt"),
    ({"prompt": 17}, "prompt"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "n": 3, "best_of": 2}, "best_of"),
    ({"prompt": "hi", "best_of": 3, "stream": True}, "best_of"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "hi", "logprobs": -1}, "logprobs"),
    ({"prompt": "hi", "echo": "yes"}, "echo"),
    ({"prompt": "hi", "suffix": "x"}, "suffix"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "temperature": 5}, "temperature"),
]


@pytest.mark.parametrize(("payload", "param"), BAD_COMPLETION_FIELDS)
def test_bad_completion_fields_are_400(client, engine, payload, param):
    assert_error(client.post(COMPLETIONS, json=payload), 400, param)
    assert engine.requests == []


def test_context_length_exceeded(client, engine):
    error = assert_error(
        client.post(CHAT, json={"messages": HELLO, "max_tokens": MAX_MODEL_LEN}),
        400,
        "max_tokens",
        "context_length_exceeded",
    )
    assert str(MAX_MODEL_LEN) in error["message"]
    too_long = list(range(3, 3 + MAX_MODEL_LEN))
    assert_error(
        client.post(COMPLETIONS, json={"prompt": too_long}),
        400,
        "prompt",
        "context_length_exceeded",
    )
    fits = client.post(COMPLETIONS, json={"prompt": too_long[:-1], "max_tokens": 1})
    assert fits.status_code == 200, fits.text
    assert_error(
        client.post(COMPLETIONS, json={"prompt": too_long[:-1], "max_tokens": 2}),
        400,
        "max_tokens",
        "context_length_exceeded",
    )
    huge = client.post(CHAT, json={"messages": HELLO, "max_tokens": 10**40})
    assert_error(huge, 400, "max_tokens", "context_length_exceeded")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_bad_namespaces_are_400(client, engine, path):
    payload = {"messages": HELLO} if path == CHAT else {"prompt": "hello"}
    assert_error(
        client.post(path, json={**payload, "cache_salt": "a"}, headers={"X-Cache-Namespace": "b"}),
        400,
    )
    assert_error(client.post(path, json={**payload, "cache_salt": ""}), 400, "cache_salt")
    assert_error(
        client.post(path, json=payload, headers={"X-Cache-Namespace": ""}), 400, "X-Cache-Namespace"
    )
    assert_error(client.post(path, json={**payload, "cache_salt": "x" * 257}), 400, "cache_salt")
    assert_error(client.post(path, json={**payload, "cache_salt": "é" * 129}), 400, "cache_salt")
    assert_error(client.post(path, json=payload, headers={"X-Cache-Namespace": "y" * 257}), 400)
    assert engine.requests == []


def test_unknown_model_route_and_method(client):
    assert_error(
        client.post(CHAT, json={"model": "gpt-9", "messages": HELLO}),
        404,
        "model",
        "model_not_found",
    )
    assert_error(
        client.post(COMPLETIONS, json={"model": "gpt-9", "prompt": "x"}),
        404,
        code="model_not_found",
    )
    assert_error(client.get("/v1/models/gpt-9"), 404, code="model_not_found")
    assert_error(client.get("/v1/nothing-here"), 404)
    assert_error(client.post("/nothing"), 404)
    assert_error(client.get("/debug/cache"), 404)  # only with --debug-endpoints
    response = client.get(CHAT)
    assert_error(response, 405, code="method_not_allowed")
    assert "POST" in response.headers["allow"]
    assert_error(client.delete("/health"), 405)


def test_body_over_the_limit_is_413_with_or_without_content_length(engine):
    app = make_app(engine, max_request_bytes=1000)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    with TestClient(app) as client:
        assert_error(client.post(CHAT, content=big), 413, code="request_too_large")

        def chunked():
            for i in range(0, len(big), 100):
                yield big[i : i + 100]

        response = client.post(
            CHAT, content=chunked(), headers={"Content-Type": "application/json"}
        )
        assert_error(response, 413)
        small = json.dumps({"messages": HELLO}).encode()
        assert client.post(CHAT, content=iter([small[:10], small[10:]])).status_code == 200
    assert engine.requests and len(engine.requests) == 1
    assert app.state.internal_errors == 0


def test_api_key_guards_v1_but_not_health_or_metrics(engine):
    app = make_app(engine, api_key="s3cret", debug_endpoints=True)
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            error = assert_error(
                client.post(CHAT, json={"messages": HELLO}, headers=headers),
                401,
                type_="authentication_error",
            )
            assert error["code"] == "invalid_api_key"
            assert_error(
                client.get("/v1/models", headers=headers), 401, type_="authentication_error"
            )
            assert_error(
                client.get("/debug/cache", headers=headers), 401, type_="authentication_error"
            )
            assert_error(
                client.post("/v1/cache/flush", headers=headers), 401, type_="authentication_error"
            )
        assert engine.requests == [] and engine.flushes == 0
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        good = {"Authorization": "Bearer s3cret"}
        assert client.post(CHAT, json={"messages": HELLO}, headers=good).status_code == 200
        assert client.get("/v1/models", headers=good).status_code == 200


def test_queue_full_is_429_and_unavailable_is_503(client, engine):
    engine.queue_full = True
    response = client.post(CHAT, json={"messages": HELLO})
    assert_error(response, 429, type_="rate_limit_error")
    assert response.headers["Retry-After"] == "1"
    assert_error(
        client.post(CHAT, json={"messages": HELLO, "stream": True}), 429, type_="rate_limit_error"
    )
    engine.queue_full, engine.unavailable = False, True
    response = client.post(COMPLETIONS, json={"prompt": "x"})
    assert_error(response, 503, type_="server_error")
    assert "Retry-After" not in response.headers
    assert_error(
        client.post(CHAT, json={"messages": HELLO, "stream": True}), 503, type_="server_error"
    )


def test_requests_ending_in_abort_or_error(client, engine):
    engine.end_reason = FinishReason.ABORT
    assert_error(client.post(CHAT, json={"messages": HELLO}), 503, type_="server_error")
    engine.end_reason = FinishReason.ERROR
    error = assert_error(client.post(CHAT, json={"messages": HELLO}), 500, type_="server_error")
    assert "boom" in error["message"]
    engine.end_reason = FinishReason.QUEUE_FULL  # a fork refused past --max-queue
    response = client.post(CHAT, json={"messages": HELLO})
    assert_error(response, 429, code="queue_full", type_="rate_limit_error")


def test_the_catch_all_is_a_500_in_openai_shape(engine):
    engine.crash_before_start = True
    app = make_app(engine)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post(CHAT, json={"messages": HELLO})
        error = assert_error(response, 500, type_="server_error")
        assert "engine bug" not in error["message"]  # no internals leak
    assert app.state.internal_errors == 1


def test_a_namespace_header_that_is_not_utf8_is_400():
    # Starlette hands header bytes over as latin-1 text; \xff\xfe is not UTF-8.
    with pytest.raises(APIError) as caught:
        resolve_namespace(None, b"\xff\xfe".decode("latin-1"), None)
    assert caught.value.status == 400 and caught.value.param == "X-Cache-Namespace"
    assert resolve_namespace(None, "ü".encode().decode("latin-1"), None) == "ü"


def test_a_namespace_with_nul_is_400_and_tenants_get_their_own():
    with pytest.raises(APIError) as caught:
        resolve_namespace("a\0b", None, None)
    assert caught.value.status == 400 and "NUL" in caught.value.message
    assert resolve_namespace(None, None, "acme") == "\0tenant\0acme"
    assert resolve_namespace("x", None, "acme") == "\0tenant\0acme\0x"
    assert resolve_namespace("x", None, None) == "x"

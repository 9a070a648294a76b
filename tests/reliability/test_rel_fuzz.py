"""Hostile input against a real server: a schemathesis fuzz of every operation in its OpenAPI
document (positive and negative cases), plus hand-written attacks. Only 200 or a 4xx in
OpenAI's error shape may come back, never a 5xx, and the server stays healthy."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.reliability.conftest import AUTH
from tests.reliability.harness import MODEL, FaultServer

# `make test` runs a short fuzz; TKV_FUZZ_EXAMPLES raises it (the slow run below uses 60).
QUICK_EXAMPLES = int(os.environ.get("TKV_FUZZ_EXAMPLES", "6"))
ERROR_FIELDS = {"message", "type", "param", "code"}


def check_response(response) -> None:  # a schemathesis Response or an httpx.Response
    status = response.status_code
    assert status < 500, (status, response.text[:500])
    if status >= 400:
        assert set(response.json()["error"]) == ERROR_FIELDS, response.text[:500]
        assert "detail" not in response.json()


def still_healthy(server: FaultServer) -> None:
    assert server.health()[0] == 200
    state = server.debug_cache(headers=AUTH)
    assert state["ok"], state["problems"]
    assert state["locked_nodes"] == 0


MAX_FUZZ_SEQUENCES = 4


def bound_sequences(body: object) -> None:
    """Valid bodies may ask for up to 128 sequences (`n`, `best_of`) of the model's whole length:
    minutes on the 6 MiB test server, past the client's timeout. Sequences beyond 4 test
    nothing more; the refusal of invalid counts is tested with bodies as generated."""
    if not isinstance(body, dict):
        return
    for field in ("n", "best_of"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_FUZZ_SEQUENCES:
            body[field] = MAX_FUZZ_SEQUENCES


def fuzz(server: FaultServer, max_examples: int) -> dict[str, int]:
    """Run `max_examples` positive and as many negative cases against every operation of the
    server's OpenAPI document; returns the examples run per operation.

    (schemathesis.pytest.from_fixture fails under pytest 9 (`Function._nodeid`), so the
    strategies are driven by hypothesis directly, as the schema is only known at run time.)"""
    schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json", headers=AUTH)
    runs: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            label = f"{operation.label} {mode.value}"

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=max_examples,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: schemathesis.Case) -> None:
                if mode is GenerationMode.POSITIVE:  # noqa: B023 - run() is called right here
                    bound_sequences(case.body)
                response = case.call(headers=AUTH, timeout=120)
                assert response.status_code < 500, (case.body, case.headers)
                check_response(response)
                runs[label] = runs.get(label, 0) + 1  # noqa: B023 - run() is called right here

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (GET routes without parameters)
                assert mode is GenerationMode.NEGATIVE, label
    return runs


def test_schema_fuzz_quick(guarded: FaultServer) -> None:
    runs = fuzz(guarded, QUICK_EXAMPLES)
    assert {"POST /v1/chat/completions positive", "POST /v1/completions negative"} <= set(runs)
    assert sum(runs.values()) >= len(runs)


@pytest.mark.slow
def test_schema_fuzz_long(guarded: FaultServer) -> None:
    runs = fuzz(guarded, 60)
    assert sum(runs.values()) >= 60 * 4


def test_still_healthy_after_fuzz(guarded: FaultServer) -> None:
    still_healthy(guarded)


def raw(server: FaultServer, body: bytes, headers: dict | None = None) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json", **(headers or {})}
    return httpx.post(
        server.base_url + "/v1/chat/completions", content=body, headers=headers, timeout=60
    )


def body_with(**fields) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **fields,
    }


HOSTILE = {
    "huge-body": (b'{"a": "' + b"x" * (1 << 20) + b'"}', 413),
    "deep-json": (b"[" * 30_000 + b"]" * 30_000, 400),
    "deep-object": (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, 400),
    "invalid-utf8": (b'{"model": "\xff\xfe", "messages": []}', 400),
    "lone-surrogate": (
        b'{"messages": [{"role": "user", "content": "\\udc80"}], "max_tokens": 1}',
        None,
    ),
    "nan": (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400),
    "empty": (b"", 400),
    "not-an-object": (b"[1, 2, 3]", 400),
    "truncated": (b'{"messages": [{"role": "us', 400),
    "nul-bytes": (
        b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 1}',
        200,
    ),
}
FIELDS = {
    "negative-max-tokens": ({"max_tokens": -1}, 400),
    "huge-max-tokens": ({"max_tokens": 10**30}, 400),
    "huge-temperature": ({"temperature": 1e308}, 400),
    "negative-temperature": ({"temperature": -0.5}, 400),
    "tiny-temperature": ({"temperature": 1e-300}, 200),
    "tiny-top-p": ({"temperature": 1.0, "top_p": 1e-300}, 200),
    "huge-seed": ({"seed": 2**64}, 400),
    "huge-top-k": ({"top_k": 2**70}, 400),
    "negative-stop-id": ({"stop_token_ids": [-5]}, 400),
    "huge-stop-id": ({"stop_token_ids": [2**40]}, 400),
    "string-max-tokens": ({"max_tokens": "2"}, 400),
    "unknown-fields": ({"frobnicate": {"x": [1, 2]}, "metadata": None}, 200),
    "n-129": ({"n": 129}, 400),
    "n-3": ({"n": 3, "seed": 1}, 200),
    "huge-top-logprobs": ({"logprobs": True, "top_logprobs": 10**9}, 400),
    "top-logprobs-20": ({"logprobs": True, "top_logprobs": 20}, 200),
    "logit-bias-too-many": ({"logit_bias": {str(i): 1.0 for i in range(1025)}}, 400),
    "tools": ({"tools": [{"type": "function"}]}, 400),
    "bad-role": ({"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    "content-object": ({"messages": [{"role": "user", "content": {"a": 1}}]}, 400),
    "many-stops": ({"stop": ["x"] * 5000}, None),
    "long-prompt": ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400),
    "unknown-model": ({"model": "gpt-9"}, 404),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_bodies(guarded: FaultServer, name: str) -> None:
    body, status = HOSTILE[name]
    response = raw(guarded, body)
    check_response(response)
    if status is not None:
        assert response.status_code == status, response.text[:300]


@pytest.mark.parametrize("name", list(FIELDS))
def test_hostile_fields(guarded: FaultServer, name: str) -> None:
    fields, status = FIELDS[name]
    response = guarded.post("/v1/chat/completions", body_with(**fields), headers=AUTH)
    check_response(response)
    if status is not None:
        assert response.status_code == status, response.text[:300]


def test_hostile_completions_prompts(guarded: FaultServer) -> None:
    url = "/v1/completions"
    for prompt in ([10**12], [-1], [[1, 2], [3]], [], "", [0] * 5000):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        response = guarded.post(url, body, headers=AUTH)
        check_response(response)
        assert response.status_code == 400, (prompt[:3], response.text[:300])


def test_chunked_body_over_the_limit(guarded: FaultServer) -> None:
    def chunks():
        for _ in range(200):
            yield b" " * 1024

    response = httpx.post(
        guarded.base_url + "/v1/chat/completions",
        content=chunks(),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    check_response(response)


def test_other_methods_and_routes(guarded: FaultServer) -> None:
    calls = [("GET", "/v1/chat/completions"), ("PUT", "/v1/models"), ("GET", "/v1/nothing")]
    calls += [("DELETE", "/health"), ("GET", "/../etc/passwd"), ("POST", "/v1/models/x%00y")]
    for method, path in calls:
        response = httpx.request(method, guarded.base_url + path, headers=AUTH, timeout=30)
        assert 400 <= response.status_code < 500, (method, path)
        check_response(response)


def test_still_healthy_after_hostile_input(guarded: FaultServer) -> None:
    still_healthy(guarded)
    reply = guarded.post("/v1/chat/completions", body_with(), headers=AUTH)
    assert reply.status_code == 200

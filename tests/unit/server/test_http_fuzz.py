"""Random bodies never reach the catch-all: every answer is a 200 or a 4xx in OpenAI's shape."""

import json

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.server.conftest import MODEL_NAME, make_app

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | JSON},
    optional={"content": st.text(max_size=20) | JSON, "name": JSON},
)
COMMON = {
    "model": st.just(MODEL_NAME) | JSON,
    "max_tokens": st.integers(-3, 300) | JSON,
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON,
    "top_p": st.floats(-0.5, 1.5, allow_nan=False) | JSON,
    "top_k": st.integers(-3, 50) | JSON,
    "seed": st.integers() | JSON,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | JSON,
    "stop_token_ids": st.lists(st.integers(-2, 400), max_size=3) | JSON,
    "ignore_eos": JSON,
    "min_tokens": st.integers(-2, 20) | JSON,
    "n": st.integers(0, 3) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
    "cache_salt": st.text(max_size=300) | JSON,
}
CHAT_BODY = st.fixed_dictionaries(
    {},
    optional={
        **COMMON,
        "messages": st.lists(MESSAGE, max_size=3) | JSON,
        "max_completion_tokens": st.integers(-3, 300) | JSON,
        "tools": JSON,
        "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])})
        | JSON,
        "logprobs": JSON,
        "top_logprobs": JSON,
    },
)
COMPLETION_BODY = st.fixed_dictionaries(
    {},
    optional={
        **COMMON,
        "prompt": st.text(max_size=20) | st.lists(st.integers(-2, 400), max_size=5) | JSON,
        "echo": JSON,
        "suffix": JSON,
        "best_of": JSON,
        "logprobs": JSON,
    },
)


def check(response):
    if response.status_code == 200:
        return
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chat=CHAT_BODY, completion=COMPLETION_BODY, raw=st.binary(max_size=40))
def test_random_bodies_are_answered_200_or_4xx(engine, chat, completion, raw):
    app = make_app(engine)
    with TestClient(app) as client:
        check(client.post("/v1/chat/completions", content=json.dumps(chat)))
        check(client.post("/v1/completions", content=json.dumps(completion)))
        check(client.post("/v1/chat/completions", content=raw))
    assert app.state.internal_errors == 0

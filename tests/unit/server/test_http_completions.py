"""Non-streamed completions: response shape, usage, sampling fields and namespaces reach the
engine as GenerationRequests."""

import re

import pytest

from tests.unit.server.conftest import MAX_MODEL_LEN, MODEL_NAME
from tests.unit.server.fake_engine import REPLY
from tieredkv.engine.protocol import DEFAULT_NAMESPACE

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hello world"}]


def chat(client, headers=None, **fields):
    return client.post(
        CHAT, json={"model": MODEL_NAME, "messages": HELLO, **fields}, headers=headers
    )


def test_chat_completion_shape_and_usage(client, engine):
    response = chat(client)
    assert response.status_code == 200, response.text
    body = response.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL_NAME and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": REPLY}
    request = engine.requests[-1]
    assert request.request_id == body["id"]
    assert body["usage"] == {
        "prompt_tokens": len(request.prompt_ids),
        "completion_tokens": len(engine.reply_ids()),
        "total_tokens": len(request.prompt_ids) + len(engine.reply_ids()),
        "prompt_tokens_details": {
            "cached_tokens": 48,
            "cached_tokens_by_tier": {"device": 16, "host": 32, "disk": 0, "remote": 0},
        },
    }


def test_chat_prompt_is_the_templated_conversation(client, engine, tokenizer):
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}],
        },
    ]
    assert client.post(CHAT, json={"messages": messages}).status_code == 200
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello\nworld"}]
    )
    assert list(engine.requests[-1].prompt_ids) == expected


def test_max_tokens_defaults_to_the_rest_of_the_context(client, engine):
    assert chat(client).status_code == 200
    request = engine.requests[-1]
    assert request.sampling.max_tokens == MAX_MODEL_LEN - len(request.prompt_ids)
    assert request.namespace == DEFAULT_NAMESPACE


def test_max_tokens_truncates_with_finish_reason_length(client, engine):
    body = chat(client, max_tokens=3).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["message"]["content"] == engine.tokenizer.decode(
        engine.reply_ids()[:3]
    )


def test_sampling_fields_reach_the_engine(client, engine):
    fields = {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "seed": 1234,
        "max_completion_tokens": 20,
        "max_tokens": 99,  # max_completion_tokens wins
        "stop": ["fox", "dog"],
        "stop_token_ids": [5, 6],
        "ignore_eos": True,
        "min_tokens": 2,
        "n": 1,
        "tools": [],
        "response_format": {"type": "text"},
        "logprobs": False,
        "some_future_field": {"x": 1},  # unknown: ignored
    }
    assert chat(client, **fields).status_code == 200
    sampling = engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (
        0.5,
        0.9,
        7,
        1234,
    )
    assert sampling.max_tokens == 20 and sampling.min_tokens == 2 and sampling.ignore_eos
    assert sampling.stop == ("fox", "dog") and sampling.stop_token_ids == frozenset({5, 6})
    assert chat(client, stop="fox", top_k=-1).status_code == 200
    assert engine.requests[-1].sampling.stop == ("fox",)
    assert engine.requests[-1].sampling.top_k == 0


def test_text_completion_with_string_and_token_prompts(client, engine, tokenizer):
    body = client.post(COMPLETIONS, json={"model": MODEL_NAME, "prompt": "hello world"}).json()
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", body["id"]) and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY and body["choices"][0]["finish_reason"] == "stop"
    assert list(engine.requests[-1].prompt_ids) == tokenizer.encode("hello world")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["host"] == 32
    for prompt in ([5, 6, 7], [[5, 6, 7]]):
        response = client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": 4})
        assert response.status_code == 200, response.text
        assert engine.requests[-1].prompt_ids == (5, 6, 7)
    assert client.post(COMPLETIONS, json={"prompt": ["hello world"]}).status_code == 200
    assert list(engine.requests[-1].prompt_ids) == tokenizer.encode("hello world")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_namespace_from_field_or_header(client, engine, path):
    payload = {"messages": HELLO} if path == CHAT else {"prompt": "hello"}
    assert client.post(path, json={**payload, "cache_salt": "alice"}).status_code == 200
    assert engine.requests[-1].namespace == "alice"
    response = client.post(path, json=payload, headers={"X-Cache-Namespace": "bob"})
    assert response.status_code == 200 and engine.requests[-1].namespace == "bob"
    both = client.post(
        path, json={**payload, "cache_salt": "bob"}, headers={"X-Cache-Namespace": "bob"}
    )
    assert both.status_code == 200 and engine.requests[-1].namespace == "bob"
    utf8 = "é" * 128  # 256 bytes: the limit is in bytes
    response = client.post(path, json={**payload, "cache_salt": utf8})
    assert response.status_code == 200 and engine.requests[-1].namespace == utf8
    header = client.post(path, json=payload, headers={"X-Cache-Namespace": "ü".encode()})
    assert header.status_code == 200 and engine.requests[-1].namespace == "ü"

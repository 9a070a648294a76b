"""Streaming: OpenAI's SSE shape, usage chunk, deltas equal the non-streamed text, errors after
the start in-band."""

import json

from tests.unit.server.fake_engine import REPLY
from tieredkv.engine.protocol import FinishReason

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "hello world"}]


def events(response):
    """The SSE `data:` payloads, [DONE] as the string."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = response.text.split("\n\n")
    assert blocks[-1] == ""
    payloads = []
    for block in blocks[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def test_chat_stream_shape_and_usage(client, engine):
    response = client.post(
        CHAT, json={"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    )
    payloads = events(response)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    choice_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert all(len(c["choices"]) == 1 and c["usage"] is None for c in choice_chunks)
    assert [c["choices"][0]["finish_reason"] for c in choice_chunks[:-1]] == [None] * (
        len(choice_chunks) - 1
    )
    assert choice_chunks[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in choice_chunks)
    non_streamed = client.post(CHAT, json={"messages": HELLO}).json()
    assert text == REPLY == non_streamed["choices"][0]["message"]["content"]
    assert usage_chunk["choices"] == []
    request = engine.requests[0]
    assert usage_chunk["usage"] == {
        "prompt_tokens": len(request.prompt_ids),
        "completion_tokens": len(engine.reply_ids()),
        "total_tokens": len(request.prompt_ids) + len(engine.reply_ids()),
        "prompt_tokens_details": {
            "cached_tokens": 48,
            "cached_tokens_by_tier": {"device": 16, "host": 32, "disk": 0, "remote": 0},
        },
    }
    assert usage_chunk["usage"] == non_streamed["usage"]


def test_stream_without_include_usage_has_no_usage(client):
    payloads = events(client.post(CHAT, json={"messages": HELLO, "stream": True, "max_tokens": 4}))
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_text_completion_stream(client, engine):
    body = {"prompt": "hello", "stream": True, "stream_options": {"include_usage": True}}
    payloads = events(client.post(COMPLETIONS, json=body))
    chunks = payloads[:-1]
    assert payloads[-1] == "[DONE]"
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
        engine.reply_ids()
    )


def test_an_engine_failure_mid_stream_is_one_error_event_then_done(client, engine):
    engine.fail_after = 3
    payloads = events(client.post(CHAT, json={"messages": HELLO, "stream": True}))
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]
    assert set(error) == {"error"} and error["error"]["type"] == "server_error"
    assert all("choices" in p for p in payloads[:-2])
    assert len(payloads) == 2 + 1 + 3  # error, [DONE], role chunk, three content chunks


def test_a_request_ending_in_error_or_abort_mid_stream(client, engine):
    for reason, message in (
        (FinishReason.ERROR, "boom"),
        (FinishReason.ABORT, "shutting down"),
        (FinishReason.QUEUE_FULL, "queue is full"),
    ):
        engine.end_reason = reason
        payloads = events(client.post(CHAT, json={"messages": HELLO, "stream": True}))
        assert payloads[-1] == "[DONE]"
        assert message in payloads[-2]["error"]["message"]
        assert not any(p["choices"][0]["finish_reason"] for p in payloads[:-2])

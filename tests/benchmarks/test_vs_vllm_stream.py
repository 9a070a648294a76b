"""benchmarks/vllm_compare/client.py: a stream's tokens come from its usage, and a stream whose
chunks merge several tokens without saying which is refused, never counted short. The servers
here replay fixed SSE bodies (the client's counting is under test, not a server)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from benchmarks.vllm_compare.client import StreamCountError, decode_window, stream

URL = "http://server"


def sse(chunks: list[dict], usage_tokens: int) -> bytes:
    events = [{"choices": [choice]} for choice in chunks]
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": usage_tokens}})
    body = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return body.encode()


def run_stream(body: bytes, token_ids: bool = False) -> tuple[dict, dict]:
    sent: dict = {}

    def reply(request: httpx.Request) -> httpx.Response:
        sent.update(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def go() -> dict:
        async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as http:
            return await stream(http, URL, "m", [1, 2, 3, 4], 4, token_ids=token_ids)

    return asyncio.run(go()), sent


def test_one_token_a_chunk_counts_every_token() -> None:
    chunks = [{"text": word} for word in ("a", " b", " c", " d")] + [
        {"text": "", "finish_reason": "length"}
    ]
    result, sent = run_stream(sse(chunks, 4))
    assert result["tokens"] == 4 and result["chunk_tokens"] == [1, 1, 1, 1]
    assert sent["stream_options"] == {"include_usage": True} and "return_token_ids" not in sent


def test_merged_deltas_without_token_ids_are_refused() -> None:
    chunks = [{"text": "a"}, {"text": " b c"}, {"text": " d"}]  # the second carries two tokens
    with pytest.raises(StreamCountError, match="3 chunks carry 3 tokens but usage says 4"):
        run_stream(sse(chunks, 4))


def test_merged_deltas_with_token_ids_count_each_token() -> None:
    chunks = [
        {"text": "a", "token_ids": [10]},
        {"text": " b c", "token_ids": [11, 12]},
        {"text": "", "token_ids": [13]},  # a token whose text is held back still counts
    ]
    result, sent = run_stream(sse(chunks, 4), token_ids=True)
    assert sent["return_token_ids"] is True
    assert result["tokens"] == 4 and result["chunk_tokens"] == [1, 2, 1]


def test_a_stream_without_usage_is_refused() -> None:
    body = b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n'
    with pytest.raises(StreamCountError, match="without usage"):
        run_stream(body)


def test_decode_window_weighs_each_chunk_by_its_tokens() -> None:
    # two streams; in the window (1.0, 2.0] the first's last chunk carries 3 tokens
    first = {"request_start_s": 0.0, "chunk_times_s": [0.5, 1.5, 2.5], "chunk_tokens": [1, 1, 3]}
    second = {"request_start_s": 0.0, "chunk_times_s": [1.0, 1.5, 2.0], "chunk_tokens": [1, 2, 2]}
    ms_per_token, tokens_per_s = decode_window([first, second])
    # window 1.0 s: the first stream has 1 token in it (1.5), the second 2 + 2
    assert tokens_per_s == pytest.approx(5.0)
    assert ms_per_token == pytest.approx((1000 / 1 + 1000 / 4) / 2)

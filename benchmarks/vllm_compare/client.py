"""Seeded token-id prompts, and one streamed completion with its tokens counted from `usage`.

A server may merge several tokens' deltas into one chunk (vLLM does when its front end lags
behind the engine), so counting chunks as tokens undercounts it. Each stream's tokens are
`usage.completion_tokens`; a chunk's share of them is its `token_ids` where the server sends
them (`return_token_ids`), else one per chunk that carries text. When those shares do not add up
to the usage, the chunk times cannot say when each token arrived: the sample is refused
(`StreamCountError`), never counted short.
"""

from __future__ import annotations

import json
import random
import statistics
import time

import httpx

from tieredkv.bench.workload import prose
from tieredkv.errors import TieredKVError
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer


class StreamCountError(TieredKVError):
    """A stream's chunks do not account for the tokens its usage reports."""


class Prompts:
    """Token-id prompts cut from seeded prose: every call returns tokens never sent before."""

    def __init__(self, seed: int) -> None:
        self.tokenizer = ChatTokenizer(default_model_dir())
        self.rng = random.Random(seed)

    def fresh(self, num_tokens: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < num_tokens:
            ids += self.tokenizer.encode(prose(self.rng, 2000), add_special_tokens=False)
        return ids[:num_tokens]


def chunk_tokens(chunk: dict) -> int:
    """The tokens one stream chunk carries: its `token_ids` when sent, else 1 if it has text."""
    count = 0
    for choice in chunk.get("choices") or []:
        if choice.get("token_ids") is not None:
            count += len(choice["token_ids"])
        elif choice.get("text"):
            count += 1
    return count


def check_counts(url: str, counts: list[int], usage: dict | None) -> int:
    """The stream's usage tokens, after checking its chunks account for all of them."""
    if not usage or usage.get("completion_tokens") is None:
        raise StreamCountError(f"{url}: the stream ended without usage.completion_tokens")
    tokens = int(usage["completion_tokens"])
    if sum(counts) != tokens:
        raise StreamCountError(
            f"{url}: {len(counts)} chunks carry {sum(counts)} tokens but usage says {tokens}: "
            "the server merged deltas without saying which tokens each chunk holds, so chunk "
            "times are not token times (request return_token_ids, or fewer streams at once)"
        )
    return tokens


async def stream(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    salt: str | None = None,
    token_ids: bool = False,
) -> dict:
    """One greedy streamed completion: TTFT, each chunk's arrival and tokens, usage. With
    `token_ids`, asks for each chunk's token ids (`return_token_ids`: vLLM's field, which
    tieredkv ignores and sends one token a chunk)."""
    body: dict = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if salt is not None:
        body["cache_salt"] = salt
    if token_ids:
        body["return_token_ids"] = True
    start = time.perf_counter()
    times: list[float] = []
    counts: list[int] = []
    usage = None
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if count := chunk_tokens(chunk):
                times.append(time.perf_counter() - start)
                counts.append(count)
    if not times:
        raise RuntimeError(f"{url}: no tokens streamed")
    tokens = check_counts(url, counts, usage)
    return {
        "ttft_s": times[0],
        "chunk_times_s": times,
        "chunk_tokens": counts,
        "tokens": tokens,
        "usage": usage,
        "request_start_s": start,
    }


def cached_tokens(record: dict) -> int | None:
    details = (record["usage"] or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


def decode_window(records: list[dict]) -> tuple[float, float]:
    """(median ms/token of a stream, tokens/s of all) while every stream was decoding: from the
    last stream's first chunk to the first stream's last, each chunk weighing its tokens."""
    starts = [r["request_start_s"] + r["chunk_times_s"][0] for r in records]
    ends = [r["request_start_s"] + r["chunk_times_s"][-1] for r in records]
    begin, end = max(starts), min(ends)
    counts = [
        sum(
            tokens
            for t, tokens in zip(r["chunk_times_s"], r["chunk_tokens"], strict=True)
            if begin < r["request_start_s"] + t <= end
        )
        for r in records
    ]
    if end <= begin or min(counts) == 0:
        raise RuntimeError("the streams never decoded together: raise DECODE_TOKENS")
    ms_per_token = statistics.median((end - begin) * 1000 / count for count in counts)
    return ms_per_token, sum(counts) / (end - begin)

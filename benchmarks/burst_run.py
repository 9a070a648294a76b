"""One run of the burst workload against one server, from a cold cache.

Modes: `burst` (every request sent at once), `poisson` (request i sent at a seeded exponential
arrival time, mean gap 1/rate) and `grouped` (one at a time, by group then index: the reference
offline order that reuses every shared prefix while it is still cached). Before the run the
server's cache is flushed (`POST /v1/cache/flush`, which must answer 200) and `/metrics` is read
before and after for the server's own counters (preemptions, deferred admissions, step and
scheduler seconds; None when the server has none). Requests are greedy
with `ignore_eos` and a fixed `max_tokens`, so every run generates the same number of tokens.
The result is a JSON-ready dict (one entry of the report's `runs`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

import httpx

from benchmarks.burst_workload import BurstConfig, BurstRequest, grouped_order, reusable_tokens
from tieredkv.bench.client import ChatClient, scrape_metrics
from tieredkv.bench.prom_text import counter_delta, parse_samples
from tieredkv.bench.records import RequestRecord, known_sum, percentiles, ratio, summarize
from tieredkv.errors import TieredKVError

MODES = ("burst", "poisson", "grouped")
HTTP_TIMEOUT_S = 1800.0  # the last of 64 queued prefills on a slow CPU must not look failed


class FlushError(TieredKVError):
    """The server did not flush its cache, so a run would not start cold."""


def record_json(record: RequestRecord) -> dict:
    """The record as JSON, its `user` / `round_index` named for what they hold here."""
    fields = dataclasses.asdict(record)
    fields["group"], fields["index"] = fields.pop("user"), fields.pop("round_index")
    return fields


def run_figures(records: list[RequestRecord], shared: dict[tuple[int, int], int]) -> dict:
    """Hit and prompt tokens, makespan (the shared summary's wall time: first send to last byte
    of the requests that succeeded), throughput and TTFT; `shared`: each request's shared prefix
    tokens as the client counts them (`shared_prefix_tokens`), against which the server's
    cached tokens are cross-checked."""
    summary = summarize(records)
    done = [r for r in records if r.ok]
    makespan = summary["wall_s"]
    over = [
        [r.user, r.round_index]
        for r in done
        if (r.cached_tokens or 0) > shared.get((r.user, r.round_index), 0)
    ]
    return {
        "requests": summary["requests"],
        "errors": summary["errors"],
        "reusable_tokens": reusable_tokens(shared),
        "hit_tokens": known_sum(r.cached_tokens for r in done),
        "cached_over_shared": over,
        "prompt_tokens": summary["prompt_tokens"],
        "output_tokens": summary["output_tokens"],
        "makespan_s": makespan,
        "requests_per_s": summary["requests_per_s"],
        "prompt_tokens_per_s": ratio(summary["prompt_tokens"], makespan),
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "ttft_s": percentiles([r.ttft_s for r in done if r.ttft_s is not None]),
    }


def arrival_offsets(num_requests: int, rate_per_s: float, seed: int) -> list[float]:
    """Seconds from the run's start to each request's send: a seeded Poisson process."""
    rng = random.Random(f"{seed}/poisson")
    offsets, now = [], 0.0
    for _ in range(num_requests):
        offsets.append(now)
        now += rng.expovariate(rate_per_s)
    return offsets


SERVER_COUNTERS = {
    "preemptions": "tieredkv_preemptions_total",
    "deferrals": "tieredkv_deferred_admissions_total",
    "step_s": "tieredkv_step_seconds_total",
    "scheduler_s": "tieredkv_scheduler_seconds_total",
}


def server_counters(before: str | None, after: str | None) -> dict[str, float | None]:
    """The run's increase of the server's own counters (None: unknown, e.g. another server),
    and `scheduler_share`: the scheduler's and the cache bookkeeping's part of step time."""
    figures: dict[str, float | None] = dict.fromkeys([*SERVER_COUNTERS, "scheduler_share"])
    if before is None or after is None:
        return figures
    start, end = parse_samples(before), parse_samples(after)
    for key, name in SERVER_COUNTERS.items():
        figures[key] = counter_delta(start, end, name)
    figures["scheduler_share"] = ratio(figures["scheduler_s"], figures["step_s"])
    return figures


async def flush(http: httpx.AsyncClient, base_url: str) -> None:
    response = await http.post(base_url.rstrip("/") + "/v1/cache/flush")
    if response.status_code != 200:
        raise FlushError(f"POST /v1/cache/flush: HTTP {response.status_code} {response.text[:200]}")


async def _send_all(
    client: ChatClient,
    requests: list[BurstRequest],
    config: BurstConfig,
    mode: str,
    rate_per_s: float | None,
) -> list[RequestRecord]:
    async def send(request: BurstRequest, delay_s: float = 0.0) -> RequestRecord:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        return await client.chat(request.messages, config.max_tokens, request.group, request.index)

    if mode == "grouped":
        return [await send(request) for request in grouped_order(requests)]
    if mode == "burst":
        return list(await asyncio.gather(*(send(r) for r in requests)))
    assert rate_per_s is not None, "poisson arrivals need a rate"
    offsets = arrival_offsets(len(requests), rate_per_s, config.seed)
    return list(await asyncio.gather(*(send(r, d) for r, d in zip(requests, offsets, strict=True))))


async def _run(
    base_url: str,
    model: str,
    requests: list[BurstRequest],
    config: BurstConfig,
    mode: str,
    rate_per_s: float | None,
    shared: dict[tuple[int, int], int],
) -> dict:
    limits = httpx.Limits(max_connections=len(requests) + 4)
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, limits=limits) as http:
        await flush(http, base_url)
        before = await scrape_metrics(http, base_url)
        client = ChatClient(http, base_url, model, {"ignore_eos": True})
        started = time.time()
        records = await _send_all(client, requests, config, mode, rate_per_s)
        after = await scrape_metrics(http, base_url)
    server = server_counters(before, after)
    return {
        "mode": mode,
        "started_unix_s": started,
        **run_figures(records, shared),
        **server,
        "records": [record_json(r) for r in records],
    }


def run_burst(
    base_url: str,
    model: str,
    requests: list[BurstRequest],
    config: BurstConfig,
    mode: str,
    shared: dict[tuple[int, int], int],
    rate_per_s: float | None = None,
) -> dict:
    """Flush the server's cache, send `requests` as `mode` says; the run's JSON-ready result
    (`shared`: `shared_prefix_tokens` of `requests`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return asyncio.run(_run(base_url, model, requests, config, mode, rate_per_s, shared))

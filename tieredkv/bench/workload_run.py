"""One benchmark run: the workload against one server, with a /metrics scrape before and after,
summarized per round, over the reuse rounds (round >= 1: what a cache can speed up) and overall.
The result is a plain JSON-ready dict (the report's `runs[]` entry)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import httpx

from tieredkv.bench.client import (
    ChatClient,
    direct_io_of,
    fetch_health,
    scrape_metrics,
    served_model,
)
from tieredkv.bench.driver import ArrivalConfig, WorkloadDriver
from tieredkv.bench.records import RequestRecord, summarize
from tieredkv.bench.server_stats import promotion_stats, transfer_bytes
from tieredkv.bench.workload import Workload

HTTP_TIMEOUT_S = 1800.0  # a long prefill on a slow CPU must not look like a failure


def summaries(records: list[RequestRecord], num_rounds: int) -> dict:
    reuse = [r for r in records if r.round_index >= 1]
    return {
        "overall": summarize(records),
        "reuse_rounds": summarize(reuse) if reuse else None,
        "by_round": [
            summarize([r for r in records if r.round_index == i]) for i in range(num_rounds)
        ],
    }


async def _run(
    base_url: str,
    workload: Workload,
    arrival: ArrivalConfig,
    before_round: Callable[[int], None] | None,
    label: str,
    model: str | None,
    extra_body: dict | None,
    transport: httpx.AsyncBaseTransport | None,
    before_turn: Callable[[int, int], None] | None,
) -> dict:
    limits = httpx.Limits(max_connections=arrival.concurrency + 4)
    async with httpx.AsyncClient(
        timeout=HTTP_TIMEOUT_S, limits=limits, transport=transport
    ) as http:
        model = model or await served_model(http, base_url)
        client = ChatClient(http, base_url, model, extra_body)
        health = await fetch_health(http, base_url)
        before = await scrape_metrics(http, base_url)
        driver = WorkloadDriver(workload, client, arrival, before_round, label, before_turn)
        records = await driver.run()
        after = await scrape_metrics(http, base_url)
    return {
        "label": label,
        "base_url": base_url,
        "model": model,
        "metrics_available": before is not None and after is not None,
        "health": health,
        "direct_io": direct_io_of(health),
        "summary": summaries(records, workload.config.num_rounds),
        "promotion": promotion_stats(before, after),
        "transfer_bytes": transfer_bytes(before, after),
        "records": [dataclasses.asdict(r) for r in records],
    }


def run_workload(
    base_url: str,
    workload: Workload,
    arrival: ArrivalConfig,
    before_round: Callable[[int], None] | None = None,
    label: str = "",
    model: str | None = None,
    extra_body: dict | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    before_turn: Callable[[int, int], None] | None = None,
) -> dict:
    """Run `workload` against the server at `base_url`; the run's JSON-ready result.
    `transport` replaces the network (tests); `before_turn(round, user)`: see the driver."""
    run = _run(
        base_url, workload, arrival, before_round, label, model, extra_body, transport, before_turn
    )
    return asyncio.run(run)

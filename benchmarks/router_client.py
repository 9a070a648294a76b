"""The router benchmark's client: each workload request sent at its arrival time (open loop),
streamed, timed (TTFT: send to the first non-empty text) and, for Dynamo, routed first by
asking the router with the prompt's token ids and then sent to the replica it names."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx

from benchmarks.dynamo_process import DynamoRouteError, DynamoRouter
from benchmarks.router_workload import TenantRequest
from tieredkv.bench.client import parse_usage
from tieredkv.bench.records import RequestRecord
from tieredkv.model.tokenizer import ChatTokenizer


async def stream_completion(
    http: httpx.AsyncClient, url: str, body: dict, record: RequestRecord
) -> None:
    """POST a streamed completion to `url`; TTFT at the first non-empty text, usage at the end."""
    try:
        async with http.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:300]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                event = json.loads(line[len("data:") :])
                has_text = any(choice.get("text") for choice in event.get("choices") or [])
                if has_text and record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - record.start_s
                if event.get("usage"):
                    parse_usage(event["usage"], record)
    except httpx.HTTPError as error:
        record.error = f"{type(error).__name__}: {error}"
    record.latency_s = time.perf_counter() - record.start_s


@dataclasses.dataclass
class Sender:
    """Sends one workload request through `entry` (Dynamo, or an sglang-router's URL) to one of
    the replicas at `urls`; returns its record as a dict."""

    http: httpx.AsyncClient
    model: str
    max_tokens: int
    urls: list[str]
    entry: str | DynamoRouter
    tokenizer: ChatTokenizer

    async def send(self, request: TenantRequest, rep: int) -> dict:
        body = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record = RequestRecord(user=request.tenant, round_index=rep, start_s=time.perf_counter())
        row: dict = {"replica": None, "routed_pages": None}
        if isinstance(self.entry, DynamoRouter):
            token_ids = self.tokenizer.encode(request.prompt)  # as the replica encodes the text
            request_id = f"r{rep}-{request.index}"
            try:
                replica, row["routed_pages"] = await self.entry.route(token_ids, request_id)
            except (DynamoRouteError, OSError) as error:  # the request fails, the run goes on
                record.error = f"routing: {error}"
            else:
                row["replica"] = replica
                url = self.urls[replica] + "/v1/completions"
                await stream_completion(self.http, url, {**body, "prompt": token_ids}, record)
                await self.entry.done(request_id)
        else:
            url = self.entry + "/v1/completions"
            await stream_completion(self.http, url, {**body, "prompt": request.prompt}, record)
        return {
            "index": request.index,
            "tenant": request.tenant,
            "arrival_s": request.arrival_s,
            "ttft_s": record.ttft_s,
            "latency_s": record.latency_s,
            "prompt_tokens": record.prompt_tokens,
            "cached_tokens": record.cached_tokens,
            "cached_by_tier": record.cached_by_tier,
            "error": record.error,
            **row,
        }


async def drive(sender: Sender, requests: list[TenantRequest], rep: int) -> list[dict]:
    """Every request at its arrival time (open loop); their records in order."""
    started = time.perf_counter()

    async def one(request: TenantRequest) -> dict:
        await asyncio.sleep(max(0.0, started + request.arrival_s - time.perf_counter()))
        return await sender.send(request, rep)

    return list(await asyncio.gather(*(one(request) for request in requests)))

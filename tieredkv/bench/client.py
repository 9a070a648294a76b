"""One streamed chat completion over httpx, timed exactly: TTFT is the time from sending the
request to the first non-empty content delta; latency runs to the end of the stream. Usage
comes from the final usage chunk (`stream_options.include_usage`); any field the server leaves
out stays None (unknown)."""

from __future__ import annotations

import json
import time

import httpx

from tieredkv.bench.records import TIERS, RequestRecord


def parse_usage(usage: dict | None, record: RequestRecord) -> None:
    """Copy what `usage` reports into `record`; absent or null fields stay unknown."""
    if not isinstance(usage, dict):
        return
    record.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
    record.output_tokens = _int_or_none(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return
    record.cached_tokens = _int_or_none(details.get("cached_tokens"))
    by_tier = details.get("cached_tokens_by_tier")
    if isinstance(by_tier, dict):
        record.cached_by_tier = {tier: _int_or_none(by_tier.get(tier)) for tier in TIERS}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ChatClient:
    """Streams greedy chat completions from one OpenAI-compatible server."""

    def __init__(
        self, http: httpx.AsyncClient, base_url: str, model: str, extra_body: dict | None = None
    ) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.extra_body = extra_body or {}

    async def chat(
        self, messages: list[dict], max_tokens: int, user: int, round_index: int
    ) -> RequestRecord:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }
        start = time.perf_counter()
        record = RequestRecord(user=user, round_index=round_index, start_s=start)
        parts: list[str] = []
        try:
            async with self.http.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    record.error = f"HTTP {response.status_code}: {text[:300]}"
                    return record
                async for line in response.aiter_lines():
                    self._on_line(line, record, parts, start)
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.latency_s = time.perf_counter() - start
        record.text = "".join(parts)
        return record

    @staticmethod
    def _on_line(line: str, record: RequestRecord, parts: list[str], start: float) -> None:
        if not line.startswith("data:"):
            return
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if "error" in event:
            record.error = str(event["error"])[:300]
            return
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                if record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - start
                parts.append(content)
        if event.get("usage"):
            parse_usage(event["usage"], record)


async def served_model(http: httpx.AsyncClient, base_url: str) -> str:
    """The first model id of GET /v1/models."""
    response = await http.get(base_url.rstrip("/") + "/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def scrape_metrics(http: httpx.AsyncClient, base_url: str) -> str | None:
    """GET /metrics as text, or None when the server has none."""
    try:
        response = await http.get(base_url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


async def fetch_health(http: httpx.AsyncClient, base_url: str) -> dict | None:
    """GET /health as JSON (tieredkv: tiers, capacities), or None when absent or not JSON."""
    try:
        response = await http.get(base_url.rstrip("/") + "/health")
        body = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def direct_io_of(health: dict | None) -> bool | None:
    """Whether the server says its disk tier uses O_DIRECT (`"direct_io"` in tieredkv's /health);
    None: unknown (another server, or no disk tier)."""
    value = (health or {}).get("direct_io")
    return value if isinstance(value, bool) else None

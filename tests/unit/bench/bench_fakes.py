"""A fake OpenAI-compatible server on httpx.MockTransport: streamed chat completions whose
answer depends on the conversation, with or without tieredkv's usage details and /metrics."""

from __future__ import annotations

import json

import httpx

from tieredkv.cache.tier import Tier
from tieredkv.engine.metrics import EngineMetrics


class FakeServer:
    """`tieredkv=True`: usage carries cached_tokens(_by_tier) and /metrics exists (each chat
    observes a queue time of 10 ms per message, a TTFT 3 ms longer, and one disk promotion of
    5 ms); False: a plain server that reports neither."""

    def __init__(self, tieredkv: bool, answer_prefix: str = "Answer") -> None:
        self.tieredkv = tieredkv
        self.answer_prefix = answer_prefix
        self.metrics = EngineMetrics()
        self.bodies: list[dict] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "fake-model"}]})
        if request.url.path == "/health":
            if not self.tieredkv:
                return httpx.Response(404, json={"error": "no health"})
            return httpx.Response(200, json={"status": "ok", "ready": True, "direct_io": True})
        if request.url.path == "/metrics":
            if not self.tieredkv:
                return httpx.Response(404, json={"error": "no metrics"})
            return httpx.Response(200, text=self.metrics.render())
        body = json.loads(request.content)
        self.bodies.append(body)
        return httpx.Response(200, content=self.stream(body).encode())

    def stream(self, body: dict) -> str:
        turns = len(body["messages"])
        words = [f"{self.answer_prefix} to turn {turns}", " about the", " report."]
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        cached = 0 if turns <= 2 else prompt_tokens // 2
        usage: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words)}
        if self.tieredkv:
            self.metrics.on_first_forward(0.010 * turns)
            self.metrics.on_first_token(0.010 * turns + 0.003)
            by_tier = {"device": 0, "host": cached - cached // 2, "disk": cached // 2}
            usage["prompt_tokens_details"] = {
                "cached_tokens": cached,
                "cached_tokens_by_tier": by_tier,
            }
            if cached:
                self.metrics.on_promotion(Tier.DISK, 0.005)
                self.metrics.transfer_bytes.inc(4096.0, from_tier="disk", to_tier="host")
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        events += [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
        events.append({"choices": [], "usage": usage})
        lines = [f"data: {json.dumps(e)}\n\n" for e in events]
        return "".join(lines) + "data: [DONE]\n\n"

"""A fake EngineClient for server tests: it "generates" a fixed reply, one token per update,
and can be told to refuse (queue full, unavailable), fail mid-stream, finish with an error or
an abort, or stall forever after the first tokens (to test client disconnects)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tieredkv.engine.protocol import (
    EngineClient,
    EngineUnavailableError,
    FinishReason,
    GenerationRequest,
    QueueFullError,
    RequestOutput,
    Usage,
)
from tieredkv.model.tokenizer import ChatTokenizer, IncrementalDecoder
from tieredkv.tenants import in_tenant

REPLY = "Hello there! The cache is warm, héhé."
METRICS_TEXT = "# TYPE tieredkv_prompt_tokens_total counter\ntieredkv_prompt_tokens_total 7\n"


@dataclass
class FakeEngine(EngineClient):
    tokenizer: ChatTokenizer
    reply: str = REPLY
    ready: bool = True
    queue_full: bool = False
    unavailable: bool = False
    crash_before_start: bool = False  # a bug: a plain exception before the first update
    fail_after: int | None = None  # raise after this many updates
    end_reason: FinishReason | None = None  # finish with ABORT / ERROR after the first update
    stall_after: int | None = None  # wait forever after this many updates
    cached_by_tier: dict[str, int] = field(
        default_factory=lambda: {"device": 16, "host": 32, "disk": 0, "remote": 0}
    )
    requests: list[GenerationRequest] = field(default_factory=list)
    closed_early: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    flushes: int = 0
    pins: dict[tuple[str, tuple[int, ...]], int] = field(default_factory=dict)
    closed: bool = True  # nothing to close: a runner's shutdown never waits for it
    flush_scopes: list[Callable[[str], bool] | None] = field(default_factory=list)
    closed_event: threading.Event = field(default_factory=threading.Event)

    def reply_ids(self) -> list[int]:
        return self.tokenizer.encode(self.reply, add_special_tokens=False)

    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        if self.queue_full:
            raise QueueFullError("3 requests waiting")
        if self.unavailable or not self.ready:
            raise EngineUnavailableError("shutting down")
        if self.crash_before_start:
            raise RuntimeError("engine bug")
        self.requests.append(request)
        ids = self.reply_ids()[: request.sampling.max_tokens]
        decoder = IncrementalDecoder(self.tokenizer)
        finished = False
        try:
            for i, token in enumerate(ids):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("the step thread died")
                if self.stall_after is not None and i == self.stall_after:
                    await asyncio.Event().wait()
                await asyncio.sleep(0)
                text = decoder.feed([token])
                reason = None
                if self.end_reason is not None and i == 1:
                    reason = self.end_reason
                elif i == len(ids) - 1:
                    text += decoder.flush()
                    full = len(ids) == request.sampling.max_tokens
                    reason = FinishReason.LENGTH if full else FinishReason.STOP
                finished = reason is not None
                usage = self._usage(request, i + 1) if finished else None
                error = "boom" if reason is FinishReason.ERROR else None
                yield RequestOutput(
                    request.request_id, (token,), text, finished, reason, usage, error
                )
                if finished:
                    return
        finally:
            if not finished:
                self.closed_early.append(request.request_id)
                self.closed_event.set()

    def _usage(self, request: GenerationRequest, num_output: int) -> Usage:
        cached = sum(self.cached_by_tier.values())
        return Usage(len(request.prompt_ids), num_output, cached, dict(self.cached_by_tier))

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def pin(self, namespace: str, prompt_ids: tuple[int, ...]) -> dict:
        self.pins[(namespace, prompt_ids)] = len(prompt_ids) // 16
        pages = len(prompt_ids) // 16
        return {"pinned_tokens": pages * 16, "pinned_pages": pages,
                "namespace_pinned_pages": pages, "budget_pages": 1000}  # fmt: skip

    async def unpin(self, namespace: str, prompt_ids: tuple[int, ...]) -> bool:
        return self.pins.pop((namespace, prompt_ids), None) is not None

    async def list_pins(self) -> dict:
        pins = [
            {"namespace": namespace, "token_ids": ids, "pinned_pages": pages, "held": True}
            for (namespace, ids), pages in self.pins.items()
        ]
        total = sum(self.pins.values())
        return {"pins": pins, "budget_pages": 1000, "total_pinned_pages": total,
                "total_budget_pages": 2000}  # fmt: skip

    def pins_to_restore(self) -> list[tuple[str, tuple[int, ...]]]:
        return []

    async def flush_cache(self, tenant: str | None = None) -> int:
        self.flushes += 1
        self.flush_scopes.append(None if tenant is None else lambda n: in_tenant(n, tenant))
        return 42

    async def debug_cache(self) -> dict:
        return {"ok": True, "pages": {"device": {"free": 10}}}

    def health(self) -> dict:
        tiers = {"device": "healthy", "host": "healthy", "disk": "disabled"}
        return {"ready": self.ready, "tiers": tiers}

    def render_metrics(self) -> str:
        return METRICS_TEXT

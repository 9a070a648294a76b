"""OpenAI response bodies: full responses, stream chunks and `usage`, for chat
(`chat.completion[.chunk]`) and text (`text_completion`) completions."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tieredkv.engine.protocol import FinishReason, Usage

from .errors import APIError

TIER_LABELS = ("device", "host", "disk", "remote")


def new_request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def usage_body(usage: Usage | None, num_prompt_tokens: int, num_output_tokens: int) -> dict:
    """OpenAI's `usage` plus `prompt_tokens_details.cached_tokens_by_tier` (all three tiers).
    Without the engine's Usage (it always sends one) the counts come from the server's own."""
    if usage is None:
        usage = Usage(num_prompt_tokens, num_output_tokens, 0)
    by_tier = {tier: int(usage.cached_tokens_by_tier.get(tier, 0)) for tier in TIER_LABELS}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_by_tier": by_tier,
        },
    }


def finish_error(output_reason: FinishReason | None, error: str | None) -> APIError | None:
    """The error a request ended with: ABORT (shutting down) is 503, ERROR a 500; None when it
    finished normally (stop or length)."""
    if output_reason is FinishReason.ABORT:
        message = "the request was cancelled: the server is shutting down"
        return APIError(503, message, "server_error", None, "service_unavailable")
    if output_reason is FinishReason.ERROR:
        message = f"the engine failed this request: {error or 'unknown error'}"
        return APIError(500, message, "server_error", None, "engine_error")
    if output_reason is None:
        return APIError(500, "the engine ended the request without a finish reason", "server_error")
    return None


@dataclass
class ResponseFormatter:
    """The envelope shared by every body of one request: id, object type, created, model."""

    chat: bool
    model: str
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def full(self, text: str, finish_reason: str, usage: dict) -> dict[str, Any]:
        """The non-streamed response."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason)
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = usage
        return body

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        with_usage_field: bool = False,
    ) -> dict[str, Any]:
        """One stream chunk. Chat: the first delta carries the role, the finishing one is empty.
        With include_usage every chunk carries `usage: null`, as OpenAI's do."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice.update(logprobs=None, finish_reason=finish_reason)
        body = self._envelope(self._chunk_object, [choice])
        if with_usage_field:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict) -> dict[str, Any]:
        """The final chunk of a stream with include_usage: no choices, the usage."""
        body = self._envelope(self._chunk_object, [])
        body["usage"] = usage
        return body

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

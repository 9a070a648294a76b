"""OpenAI response bodies: full responses, stream chunks and `usage`, for chat
(`chat.completion[.chunk]`) and text (`text_completion`) completions, with `n` choices, their
logprobs (`logprobs_format`) and, for completions, `echo`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tieredkv.engine.protocol import FinishReason, QueueFullError, Usage
from tieredkv.model.logprobs import TokenLogprob

from .errors import APIError, from_exception
from .logprobs_format import TokenTexts, chat_logprobs, completion_logprobs

TIER_LABELS = ("device", "host", "disk", "remote")


def new_request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def usage_body(usage: Usage | None, num_prompt_tokens: int, num_output_tokens: int) -> dict:
    """OpenAI's `usage` plus `prompt_tokens_details.cached_tokens_by_tier` (every tier), the
    prompt counted once however many choices there are (`usage` is sequence 0's) and the
    completion tokens of all of them (`num_output_tokens`). Without the engine's Usage (it
    always sends one) the counts come from the server's own."""
    if usage is None:
        usage = Usage(num_prompt_tokens, num_output_tokens, 0)
    else:
        usage = Usage(
            usage.prompt_tokens,
            num_output_tokens,
            usage.cached_tokens,
            usage.cached_tokens_by_tier,
        )
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
    """The error a request ended with: ABORT (shutting down) is 503, ERROR a 500, QUEUE_FULL
    (a fork refused past --max-queue) the 429 of a refused request; None when it finished
    normally (stop or length)."""
    if output_reason is FinishReason.ABORT:
        message = "the request was cancelled: the server is shutting down"
        return APIError(503, message, "server_error", None, "service_unavailable")
    if output_reason is FinishReason.ERROR:
        message = f"the engine failed this request: {error or 'unknown error'}"
        return APIError(500, message, "server_error", None, "engine_error")
    if output_reason is FinishReason.QUEUE_FULL:
        return from_exception(QueueFullError(error or "the queue is full"))
    if output_reason is None:
        return APIError(500, "the engine ended the request without a finish reason", "server_error")
    return None


@dataclass
class Choice:
    """One choice as collected from the engine's updates of its sequence."""

    index: int
    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    usage: Usage | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def cumulative_logprob(self) -> float:
        return sum(logprob.logprob for logprob in self.logprobs)


@dataclass(frozen=True)
class Echo:
    """Completions with `echo`: the prompt, as text and ids, goes before each choice's text."""

    text: str
    token_ids: tuple[int, ...]


@dataclass
class ResponseFormatter:
    """The envelope shared by every body of one request (id, object type, created, model) and
    how its choices read: with logprobs (`text_of` names the tokens) and, completions only,
    with the prompt echoed."""

    chat: bool
    model: str
    request_id: str
    text_of: TokenTexts | None = None  # set: the choices carry logprobs
    echo: Echo | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    _offsets: dict[int, int] = field(default_factory=dict)  # a stream's text_offset by index

    def _envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def full(self, choices: Sequence[Choice], usage: dict) -> dict[str, Any]:
        """The non-streamed response; `choices` are numbered in the order given."""
        bodies = []
        for number, choice in enumerate(choices):
            body: dict[str, Any] = {"index": number}
            if self.chat:
                body["message"] = {"role": "assistant", "content": choice.text}
            else:
                body["text"] = (self.echo.text if self.echo else "") + choice.text
            logprobs = self._logprobs(choice.token_ids, choice.logprobs, choice.prompt_logprobs)
            assert choice.finish_reason is not None
            body.update(logprobs=logprobs, finish_reason=choice.finish_reason.value)
            bodies.append(body)
        obj = "chat.completion" if self.chat else "text_completion"
        response = self._envelope(obj, bodies)
        response["usage"] = usage
        return response

    def _logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprob],
        prompt_logprobs: Sequence[TokenLogprob | None] | None,
        offset: int = 0,
    ) -> dict[str, Any] | None:
        if self.text_of is None:
            return None
        if self.chat:
            return chat_logprobs(logprobs, self.text_of)
        ids: list[int] = list(token_ids)
        scored: list[TokenLogprob | None] = list(logprobs)
        if self.echo is not None and prompt_logprobs is not None:
            ids = [*self.echo.token_ids, *ids]
            scored = [*prompt_logprobs, *scored]
        return completion_logprobs(ids, scored, self.text_of, offset)

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        with_usage_field: bool = False,
        index: int = 0,
        token_ids: Sequence[int] = (),
        logprobs: Sequence[TokenLogprob] = (),
        prompt_logprobs: Sequence[TokenLogprob | None] | None = None,
    ) -> dict[str, Any]:
        """One stream chunk of choice `index`. Chat: the first delta carries the role, the
        finishing one is empty. Completions with echo: the first carries the prompt. With
        include_usage every chunk carries `usage: null`, as OpenAI's do."""
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            echoed = self.echo.text if self.echo is not None and first else ""
            choice["text"] = echoed + (text or "")
        chunk_logprobs = None
        if self.text_of is not None and (token_ids or prompt_logprobs is not None):
            offset = self._offsets.get(index, 0)
            chunk_logprobs = self._logprobs(token_ids, logprobs, prompt_logprobs, offset)
            if chunk_logprobs is not None and not self.chat:
                offsets, tokens = chunk_logprobs["text_offset"], chunk_logprobs["tokens"]
                if offsets:
                    self._offsets[index] = offsets[-1] + len(tokens[-1])
        choice.update(logprobs=chunk_logprobs, finish_reason=finish_reason)
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

"""Reading the engine's output stream: the first update (where queue and availability errors
surface, still as HTTP statuses), the collected non-streamed result, and Server-Sent Events.

Whenever the server stops reading before the request finished (the client hung up, an error,
cancellation), the engine's iterator is closed: that aborts the request and frees its pages.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Send

from tieredkv.engine.protocol import RequestOutput

from .errors import APIError, ClientGone, from_exception
from .responses import ResponseFormatter, finish_error, usage_body

log = logging.getLogger(__name__)

T = TypeVar("T")
DONE_EVENT = "data: [DONE]\n\n"


async def close_quietly(iterator: AsyncIterator[RequestOutput]) -> None:
    """Close the engine's iterator even while being cancelled (the abort must reach it)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await aclose()
        except Exception:
            log.exception("closing the engine's output stream failed")


async def _client_disconnected(request: Request) -> None:
    """Returns once the client hangs up (the body must have been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (with `work` cancelled) if the client hangs up first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_client_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


async def first_output(iterator: AsyncIterator[RequestOutput]) -> RequestOutput:
    """The first update; QueueFullError / EngineUnavailableError surface here."""
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        raise APIError(500, "the engine ended the request without output", "server_error") from None
    except BaseException:
        await close_quietly(iterator)
        raise


@dataclass
class Collected:
    text: str = ""
    num_output_tokens: int = 0
    last: RequestOutput | None = None
    parts: list[str] = field(default_factory=list)


async def collect(iterator: AsyncIterator[RequestOutput], first: RequestOutput) -> Collected:
    """Every update until the finished one (the iterator is closed if we stop early)."""
    result = Collected()
    output = first
    try:
        while True:
            result.parts.append(output.new_text)
            result.num_output_tokens += len(output.new_token_ids)
            if output.finished:
                result.last = output
                result.text = "".join(result.parts)
                return result
            output = await anext(iterator)
    except StopAsyncIteration:
        raise APIError(500, "the engine ended the request unfinished", "server_error") from None
    finally:
        if result.last is None:
            await close_quietly(iterator)


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def sse_events(
    iterator: AsyncIterator[RequestOutput],
    first: RequestOutput,
    formatter: ResponseFormatter,
    include_usage: bool,
    num_prompt_tokens: int,
) -> AsyncIterator[str]:
    """OpenAI's stream: a role chunk (chat), content chunks, a finish chunk, the usage chunk
    (with include_usage), then [DONE]. An error after the start is one error event + [DONE]."""
    finished = False
    num_output_tokens = 0
    try:
        if formatter.chat:
            yield sse(formatter.chunk("", first=True, with_usage_field=include_usage))
        output = first
        while True:
            num_output_tokens += len(output.new_token_ids)
            if output.new_text:
                yield sse(formatter.chunk(output.new_text, with_usage_field=include_usage))
            if output.finished:
                finished = True
                break
            output = await anext(iterator)
        error = finish_error(output.finish_reason, output.error)
        if error is not None:
            yield sse(error.payload())
        else:
            assert output.finish_reason is not None
            reason = output.finish_reason.value
            yield sse(formatter.chunk(None, reason, with_usage_field=include_usage))
            if include_usage:
                usage = usage_body(output.usage, num_prompt_tokens, num_output_tokens)
                yield sse(formatter.usage_chunk(usage))
    except StopAsyncIteration:
        yield sse(APIError(500, "the engine ended the stream early", "server_error").payload())
    except Exception as exc:  # the stream has started: report in-band, never drop silently
        error = from_exception(exc)
        if error.status == 500:
            log.exception("stream %s failed", formatter.request_id)
        yield sse(error.payload())
    finally:
        if not finished:
            await close_quietly(iterator)
    yield DONE_EVENT


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body iterator however sending ends (a send that
    fails leaves the generator suspended at a `yield`; closing it aborts the request now)."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

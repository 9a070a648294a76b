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
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Send

from tieredkv.engine.protocol import RequestOutput

from .errors import APIError, ClientGone, from_exception
from .responses import Choice, ResponseFormatter, finish_error, usage_body

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


def _add_update(choice: Choice, output: RequestOutput) -> None:
    choice.parts.append(output.new_text)
    choice.token_ids.extend(output.new_token_ids)
    choice.logprobs.extend(output.logprobs)
    if output.prompt_logprobs is not None:
        choice.prompt_logprobs = output.prompt_logprobs
    if output.finished:
        choice.finish_reason = output.finish_reason
        choice.error = output.error
        choice.usage = output.usage


async def collect(
    iterator: AsyncIterator[RequestOutput], first: RequestOutput, n: int = 1
) -> list[Choice]:
    """Every update of the request's `n` sequences until each has finished (the iterator is
    closed if we stop early); the choices in index order."""
    choices = [Choice(index) for index in range(n)]
    left = n
    output = first
    try:
        while True:
            _add_update(choices[output.index], output)
            left -= output.finished
            if left == 0:
                return choices
            output = await anext(iterator)
    except StopAsyncIteration:
        raise APIError(500, "the engine ended the request unfinished", "server_error") from None
    finally:
        if left:
            await close_quietly(iterator)


def request_error(choices: list[Choice]) -> APIError | None:
    """The error the request failed with, if any sequence did not finish normally."""
    for choice in choices:
        error = finish_error(choice.finish_reason, choice.error)
        if error is not None:
            return error
    return None


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def sse_events(
    iterator: AsyncIterator[RequestOutput],
    first: RequestOutput,
    formatter: ResponseFormatter,
    include_usage: bool,
    num_prompt_tokens: int,
    n: int = 1,
) -> AsyncIterator[str]:
    """OpenAI's stream: per choice (`index`) a role chunk (chat), content chunks and a finish
    chunk, interleaved as the sequences advance; the usage chunk (with include_usage), then
    [DONE]. An error after the start is one error event + [DONE]."""
    finished = False
    num_output_tokens = 0
    usage = None
    started: set[int] = set()
    left = n
    try:
        if formatter.chat:
            for index in range(n):
                chunk = formatter.chunk("", first=True, with_usage_field=include_usage, index=index)
                yield sse(chunk)
        output = first
        while True:
            num_output_tokens += len(output.new_token_ids)
            index = output.index
            first_of_choice = index not in started
            started.add(index)
            with_logprobs = formatter.text_of is not None and output.new_token_ids
            if output.new_text or with_logprobs or (first_of_choice and formatter.echo):
                chunk = formatter.chunk(
                    output.new_text,
                    first=first_of_choice and not formatter.chat,
                    with_usage_field=include_usage,
                    index=index,
                    token_ids=output.new_token_ids,
                    logprobs=output.logprobs,
                    prompt_logprobs=output.prompt_logprobs,
                )
                yield sse(chunk)
            if output.finished:
                left -= 1
                error = finish_error(output.finish_reason, output.error)
                if error is not None:
                    yield sse(error.payload())
                    finished = left == 0
                    break
                assert output.finish_reason is not None
                reason = output.finish_reason.value
                end = formatter.chunk(None, reason, with_usage_field=include_usage, index=index)
                yield sse(end)
                if index == 0:
                    usage = output.usage
                if left == 0:
                    finished = True
                    if include_usage:
                        body = usage_body(usage, num_prompt_tokens, num_output_tokens)
                        yield sse(formatter.usage_chunk(body))
                    break
            output = await anext(iterator)
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

"""`POST /v1/chat/completions` and `POST /v1/completions`: read and validate the body, build
the `GenerationRequest`, submit it, and answer with a full response or an SSE stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from tieredkv.config import KeyGrant, ServerConfig
from tieredkv.engine.protocol import EngineClient, GenerationRequest
from tieredkv.model.tokenizer import ChatTokenizer

from .generation_inputs import (
    chat_logprobs,
    chat_prompt_ids,
    check_chat_supported,
    check_completion_supported,
    check_model,
    completion_prompt_ids,
    resolve_namespace,
    sampling_params,
    session_key,
)
from .logprobs_format import TokenTexts
from .request_body import read_request
from .responses import Echo, ResponseFormatter, new_request_id, usage_body
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from .streaming import (
    ClosingStreamingResponse,
    collect,
    first_output,
    request_error,
    sse_events,
    unless_disconnected,
)

NAMESPACE_HEADER = "X-Cache-Namespace"
SESSION_HEADER = "X-Session-ID"  # or the body's `user`: the conversation kept warm
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Choices:
    """What a request's choices are: `n` returned out of `sequences` generated (best_of), with
    the top `logprobs` (None: no logprobs), and the prompt echoed before each (completions)."""

    n: int
    sequences: int
    logprobs: int | None = None
    echo: Echo | None = None


@dataclass
class CompletionHandler:
    """Serves both completion endpoints for one engine and one served model."""

    engine: EngineClient
    tokenizer: ChatTokenizer
    config: ServerConfig
    model_name: str
    max_model_len: int
    clock: Callable[[], float]

    async def chat(self, request: Request, grant: KeyGrant) -> Response:
        arrival = self.clock()
        body = await read_request(
            request,
            self.config.max_request_bytes,
            self.config.body_timeout_s,
            ChatCompletionRequest,
        )
        check_model(body.model, self.model_name)
        check_chat_supported(body)
        namespace = resolve_namespace(
            body.cache_salt, request.headers.get(NAMESPACE_HEADER), grant.tenant
        )
        prompt_ids = await run_in_threadpool(chat_prompt_ids, body, self.tokenizer)
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        )
        choices = Choices(body.n or 1, body.n or 1, chat_logprobs(body))
        return await self._generate(
            request, body, True, prompt_ids, max_tokens, "messages", namespace, arrival, choices
        )

    async def completion(self, request: Request, grant: KeyGrant) -> Response:
        arrival = self.clock()
        body = await read_request(
            request,
            self.config.max_request_bytes,
            self.config.body_timeout_s,
            CompletionRequest,
        )
        check_model(body.model, self.model_name)
        check_completion_supported(body)
        namespace = resolve_namespace(
            body.cache_salt, request.headers.get(NAMESPACE_HEADER), grant.tenant
        )
        prompt_ids = await run_in_threadpool(completion_prompt_ids, body, self.tokenizer)
        n = body.n or 1
        choices = Choices(n, body.best_of or n, body.logprobs)
        if body.echo:
            prompt = body.prompt[0] if isinstance(body.prompt, list) else body.prompt
            text = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt_ids)
            choices.echo = Echo(text, tuple(prompt_ids))
        return await self._generate(
            request, body, False, prompt_ids, body.max_tokens, "prompt", namespace, arrival, choices
        )

    async def _generate(
        self,
        request: Request,
        body: SamplingFields,
        chat: bool,
        prompt_ids: list[int],
        max_tokens: int | None,
        prompt_param: str,
        namespace: str,
        arrival: float,
        choices: Choices,
    ) -> Response:
        # best_of > n ranks its sequences by their logprob: computed even if not reported
        ranks = choices.sequences > choices.n
        logprobs = 0 if ranks and choices.logprobs is None else choices.logprobs
        sampling = sampling_params(
            body,
            max_tokens,
            len(prompt_ids),
            self.max_model_len,
            self.tokenizer.vocab_size,
            prompt_param,
            sequences=choices.sequences,
            logprobs=logprobs,
            prompt_logprobs=choices.logprobs if choices.echo else None,
            max_request_tokens=self.config.max_request_tokens,
        )
        reported = choices.logprobs is not None
        formatter = ResponseFormatter(
            chat,
            self.model_name,
            new_request_id(chat),
            text_of=TokenTexts(self.tokenizer) if reported else None,
            echo=choices.echo,
        )
        session = session_key(request.headers.get(SESSION_HEADER), body)
        generation = GenerationRequest(
            formatter.request_id,
            tuple(prompt_ids),
            sampling,
            namespace,
            arrival,
            session,
            retain=body.prompt_cache_retention == "24h",
        )
        outputs = self.engine.generate(generation)
        first = await unless_disconnected(request, first_output(outputs))
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            events = sse_events(
                outputs, first, formatter, include_usage, len(prompt_ids), choices.sequences
            )
            return ClosingStreamingResponse(
                events, media_type="text/event-stream", headers=SSE_HEADERS
            )
        results = await unless_disconnected(request, collect(outputs, first, choices.sequences))
        error = request_error(results)
        if error is not None:
            raise error
        num_output_tokens = sum(len(result.token_ids) for result in results)
        usage = usage_body(results[0].usage, len(prompt_ids), num_output_tokens)
        if ranks:
            results = sorted(results, key=lambda r: r.cumulative_logprob, reverse=True)
        return JSONResponse(formatter.full(results[: choices.n], usage))

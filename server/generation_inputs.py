"""An OpenAI request body -> the engine's `GenerationRequest`: model name, unsupported values,
namespace, prompt tokens (chat template or raw prompt), sampling fields and the context limit.

Every refusal is an `APIError` (400, or 404 for an unknown model) naming the field.
"""

from __future__ import annotations

import logging
from typing import Any

from tieredkv.engine.protocol import DEFAULT_NAMESPACE
from tieredkv.errors import RequestError
from tieredkv.model.sampler import SamplingParams
from tieredkv.model.tokenizer import ChatTokenizer
from tieredkv.tenants import tenant_namespace

from .errors import APIError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest, PinRequest, SamplingFields

log = logging.getLogger(__name__)

MAX_NAMESPACE_BYTES = 256
MAX_PROMPT_CACHE_KEY_BYTES = 256  # OpenAI's limit
MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # text is held back while it could still start a stop string
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS_ENTRIES = 1024  # each is work in every sampling step of the request
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
REQUEST_TOKENS_EXCEEDED = "request_tokens_exceeded"


def check_model(requested: str | None, served: str) -> None:
    """404 `model_not_found` unless the request names the served model (or none)."""
    if requested is not None and requested != served:
        message = f"the model {requested!r} does not exist; this server serves {served!r}"
        raise APIError(404, message, "invalid_request_error", "model", "model_not_found")


def check_chat_supported(req: ChatCompletionRequest) -> None:
    """400 for known fields whose values we cannot honour (or that contradict each other)."""
    if req.tools:
        raise bad_request("tools are not supported", "tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request('only response_format {"type": "text"} is supported', "response_format")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")


def check_completion_supported(req: CompletionRequest) -> None:
    if req.best_of is not None:
        if req.best_of < (req.n or 1):
            raise bad_request(f"best_of must be >= n ({req.n}), got {req.best_of}", "best_of")
        if req.stream and req.best_of > (req.n or 1):
            raise bad_request("best_of > n cannot be streamed", "best_of")
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """The engine's `logprobs` for a chat request: None, or the top k to report (0: only the
    sampled token's)."""
    return (req.top_logprobs or 0) if req.logprobs else None


def logit_bias(req: SamplingFields, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as (id, bias) pairs; a key that is not a token id of this
    vocabulary, or a bias outside [-100, 100], is a 400."""
    if len(req.logit_bias or {}) > MAX_LOGIT_BIAS_ENTRIES:
        message = f"logit_bias holds at most {MAX_LOGIT_BIAS_ENTRIES} tokens"
        raise bad_request(message, "logit_bias")
    pairs = []
    for key, bias in (req.logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab_size:
            message = f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})"
            raise bad_request(message, "logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise bad_request(f"logit_bias values are in [-100, 100], got {bias}", "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(pairs)


def session_key(header: str | None, req: SamplingFields) -> str | None:
    """What keeps its pages warm (`tieredkv.engine.sessions`): the X-Session-ID header, else
    `prompt_cache_key` (a group of requests sharing a prefix), else `user`; 400 when
    `prompt_cache_key` is over 256 UTF-8 bytes."""
    key = req.prompt_cache_key
    if key is not None and len(key.encode("utf-8")) > MAX_PROMPT_CACHE_KEY_BYTES:
        message = f"prompt_cache_key is over {MAX_PROMPT_CACHE_KEY_BYTES} UTF-8 bytes"
        raise bad_request(message, "prompt_cache_key")
    return header or key or req.user


def resolve_namespace(cache_salt: str | None, header: str | None, tenant: str | None) -> str:
    """The cache namespace from `cache_salt` or the X-Cache-Namespace header (as Starlette
    decoded it, latin-1); both must agree; empty, over 256 UTF-8 bytes or holding NUL is
    refused. A tenant's requests live in its namespace, which a salt subdivides."""
    if header is not None:
        try:
            header = header.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise bad_request("X-Cache-Namespace is not valid UTF-8", "X-Cache-Namespace") from None
    if cache_salt is not None and header is not None and cache_salt != header:
        raise bad_request("cache_salt and X-Cache-Namespace differ", "cache_salt")
    namespace = cache_salt if cache_salt is not None else header
    if namespace is not None:
        param = "cache_salt" if cache_salt is not None else "X-Cache-Namespace"
        if not namespace:
            raise bad_request("the cache namespace must not be empty", param)
        if len(namespace.encode("utf-8")) > MAX_NAMESPACE_BYTES:
            raise bad_request(f"the cache namespace is over {MAX_NAMESPACE_BYTES} bytes", param)
        if "\0" in namespace:
            raise bad_request("the cache namespace must not contain NUL", param)
    if tenant is not None:
        return tenant_namespace(tenant, namespace)
    return DEFAULT_NAMESPACE if namespace is None else namespace


def chat_prompt_ids(
    req: ChatCompletionRequest | PinRequest,
    tokenizer: ChatTokenizer,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The chat template applied to the messages (RequestError when it refuses them)."""
    if not req.messages:
        raise bad_request("messages must not be empty", "messages")
    messages: list[dict[str, Any]] = []
    for message in req.messages:
        content: Any = message.content
        if content is None:
            content = ""
        elif isinstance(content, list):
            content = [{"type": "text", "text": part.text} for part in content]
        messages.append({"role": message.role, "content": content})
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt)
    except RequestError as exc:
        raise bad_request(str(exc), exc.param or "messages") from None
    except Exception as exc:  # a template is user-controlled code; its failures are 400s
        log.debug("chat template failed", exc_info=True)
        raise bad_request(
            f"the chat template failed on these messages: {exc}", "messages"
        ) from None


def completion_prompt_ids(
    req: CompletionRequest | PinRequest, tokenizer: ChatTokenizer
) -> list[int]:
    """A string is tokenized (with the tokenizer's BOS); a token id list is used as is."""
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) > 1:
            raise bad_request("several prompts in one request are not supported", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        bad = [i for i in ids if not 0 <= i < tokenizer.vocab_size]
        if bad:
            message = f"token id {bad[0]} is outside the vocabulary [0, {tokenizer.vocab_size})"
            raise bad_request(message, "prompt")
    if not ids:
        raise bad_request("the prompt must not be empty", "prompt")
    return ids


def within_request_tokens(
    requested_max_tokens: int | None, sequences: int, remaining: int, limit: int
) -> int | None:
    """`requested_max_tokens`, or 400 when `sequences` of it exceed `limit` tokens; an omitted
    one (None) stays None when the rest of the context (`remaining`) fits in the limit, else
    is the limit's share per sequence."""
    if requested_max_tokens is None:
        if sequences * remaining <= limit:
            return None
        requested_max_tokens = max(1, limit // sequences)
    if sequences * requested_max_tokens > limit:
        message = (
            f"{sequences} sequences (n, best_of) of up to {requested_max_tokens} tokens "
            f"(max_tokens) could generate {sequences * requested_max_tokens} tokens; this "
            f"server generates at most {limit} per request: ask for fewer"
        )
        raise bad_request(message, "max_tokens", REQUEST_TOKENS_EXCEEDED)
    return requested_max_tokens


def sampling_params(
    req: SamplingFields,
    requested_max_tokens: int | None,
    num_prompt_tokens: int,
    max_model_len: int,
    vocab_size: int,
    prompt_param: str,
    sequences: int = 1,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    max_request_tokens: int | None = None,
) -> SamplingParams:
    """SamplingParams with max_tokens defaulting to the rest of the context (within
    `max_request_tokens` over the `sequences`); 400 with code `context_length_exceeded` when
    prompt + max_tokens exceed `max_model_len`, and when the sequences together could
    generate more than `max_request_tokens` (`request_tokens_exceeded`)."""
    if requested_max_tokens is not None and requested_max_tokens <= 0:
        raise bad_request(f"max_tokens must be >= 1, got {requested_max_tokens}", "max_tokens")
    remaining = max_model_len - num_prompt_tokens
    if remaining <= 0:
        message = (
            f"the prompt has {num_prompt_tokens} tokens; this model's context is "
            f"{max_model_len} tokens and at least one must be left to generate"
        )
        raise bad_request(message, prompt_param, CONTEXT_LENGTH_EXCEEDED)
    if requested_max_tokens is not None and requested_max_tokens > remaining:
        message = (
            f"the prompt ({num_prompt_tokens} tokens) plus max_tokens ({requested_max_tokens}) "
            f"exceed this model's context of {max_model_len} tokens"
        )
        raise bad_request(message, "max_tokens", CONTEXT_LENGTH_EXCEEDED)
    if max_request_tokens is not None:
        requested_max_tokens = within_request_tokens(
            requested_max_tokens, sequences, remaining, max_request_tokens
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if any(not s for s in stop):
        raise bad_request("stop strings must not be empty", "stop")
    if len(stop) > MAX_STOPS:
        raise bad_request(f"at most {MAX_STOPS} stop strings, got {len(stop)}", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in stop):
        raise bad_request(f"a stop string has at most {MAX_STOP_CHARS} characters", "stop")
    if len(req.stop_token_ids or ()) > MAX_STOP_TOKEN_IDS:
        message = f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids"
        raise bad_request(message, "stop_token_ids")
    stop_ids = frozenset(req.stop_token_ids or ())
    if any(not 0 <= i < vocab_size for i in stop_ids):
        raise bad_request(f"stop_token_ids must be in [0, {vocab_size})", "stop_token_ids")
    try:
        return SamplingParams(
            max_tokens=requested_max_tokens if requested_max_tokens is not None else remaining,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0),  # -1 (vLLM's "off") and 0 both disable it
            seed=req.seed,
            stop=stop,
            stop_token_ids=stop_ids,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            n=sequences,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            logit_bias=logit_bias(req, vocab_size),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
        )
    except RequestError as exc:
        raise bad_request(str(exc), exc.param, exc.code) from None

"""Pydantic models of the request bodies: what `/openapi.json` describes and what requests are
validated against (strictly: no string-to-number coercion; unknown fields are kept aside and
ignored). Values the types cannot express (tools, logit_bias keys, context length) are checked
in `generation_inputs.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None


class StreamOptions(_Request):
    include_usage: bool = False


class ResponseFormat(_Request):
    type: str


class SamplingFields(_Request):
    """The sampling and stopping fields both completion endpoints accept."""

    model: str | None = Field(None, description="The served model name; omitted: the served one")
    max_tokens: int | None = Field(None, ge=1, description="Default: the rest of the context")
    temperature: float | None = Field(None, ge=0, le=2, description="OpenAI's range, 0 to 2")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX, description="0 or -1: off")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = Field(
        None, description="Up to 4 strings of at most 256 characters each"
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Up to 64 token ids"
    )
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> bias in [-100, 100], added to its logit"
    )
    presence_penalty: float | None = Field(
        None, ge=-2, le=2, description="Subtracted once from each token already generated"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2, le=2, description="Subtracted per occurrence of each token generated"
    )
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)
    n: int | None = Field(
        None, ge=1, le=128, description="Choices; the prompt is computed once and shared"
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="KV cache namespace (1..256 UTF-8 bytes); or the X-Cache-Namespace header",
    )
    user: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(
        None,
        description='"24h": the prompt\'s pages stay reusable 24 h after their last use, on the '
        'lowest local tier, within --retention-budget; "in_memory" or absent: the LRU tiers',
    )
    prompt_cache_key: str | None = Field(
        None,
        description="Groups requests sharing a prefix (1..256 UTF-8 bytes): the group's latest "
        "pages are kept warm as a session's, unless X-Session-ID names one",
    )


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="Preferred over max_tokens")
    tools: list[Any] | None = Field(None, description="Not supported: must be absent or empty")
    tool_choice: Any = None
    response_format: ResponseFormat | None = Field(None, description='Only {"type": "text"}')
    logprobs: bool | None = Field(None, description="Each generated token's logprob")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="With logprobs: the k most likely tokens at each position"
    )


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="A string or a list of token ids; a list of several prompts is refused"
    )
    logprobs: int | None = Field(
        None, ge=0, le=20, description="Each token's logprob and the k most likely tokens"
    )
    echo: bool = Field(False, description="The prompt before the completion (with its logprobs)")
    suffix: str | None = Field(None, description="Not supported: must be absent")
    best_of: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Sequences generated (>= n); the n of highest logprob are returned",
    )


class PinRequest(_Request):
    """`POST` / `DELETE /v1/cache/pin`: a prompt (text or token ids) or chat messages (the
    template applied without the generation prompt: a prefix of every later turn)."""

    prompt: str | list[int] | None = Field(None, description="Text or token ids")
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    model: str | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    PinRequest,
    ErrorResponse,
)

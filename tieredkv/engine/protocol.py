"""What the server and the engine say to each other.

The server turns an HTTP request into a `GenerationRequest` and reads `RequestOutput`s back from
an `EngineClient`; it never touches the cache, the model or the engine thread's state.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tieredkv.errors import TieredKVError
from tieredkv.model.logprobs import TokenLogprob
from tieredkv.model.sampler import SamplingParams

DEFAULT_NAMESPACE = ""  # the shared namespace of requests that name none


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS, end of turn, a stop string or a stop token id
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # the client hung up, or the server is shutting down
    ERROR = "error"  # the engine failed this request (reported, never a wrong token)
    QUEUE_FULL = "queue_full"  # a fork refused past --max-queue, as a new request is (429)


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    namespace: str = DEFAULT_NAMESPACE
    arrival_time: float = 0.0  # the engine clock's time when the server received it
    session: str | None = None  # the conversation it continues (kept warm: `sessions`)
    retain: bool = False  # prompt_cache_retention "24h": its prompt's pages are retained


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens reused, not recomputed
    # tier label ("device", "host", "disk") -> tokens served or promoted from it; all three
    # keys present, summing to cached_tokens
    cached_tokens_by_tier: dict[str, int] = field(
        default_factory=lambda: {"device": 0, "host": 0, "disk": 0}
    )


@dataclass(frozen=True)
class RequestOutput:
    """One update of one of a request's sequences (`index`: 0 .. n - 1; a request with `n`
    sequences ends after each has sent its update with finished=True): the tokens and text
    produced since the previous update."""

    request_id: str
    new_token_ids: tuple[int, ...] = ()
    new_text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage | None = None  # set on the final update; the prompt counted by index 0 only
    error: str | None = None  # set when finish_reason is ERROR
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked
    # one per prompt token (None for the first), on the sequence's first update, when asked
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


class QueueFullError(TieredKVError):
    """The waiting queue holds --max-queue requests (HTTP 429)."""


class EngineUnavailableError(TieredKVError):
    """The engine is starting or shutting down (HTTP 503)."""


class EngineClient(ABC):
    """The engine as the server's event loop sees it. Thread-safe; methods are async."""

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Submit and stream updates until one with finished=True. Raises QueueFullError or
        EngineUnavailableError before the first update. Closing the iterator early (the client
        hung up) aborts the request and frees its pages."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a request if it is still queued or running."""

    @abstractmethod
    async def flush_cache(self, tenant: str | None = None) -> int:
        """Drop every cached page in every tier (with `tenant`: in that tenant's namespaces)
        and forget the rest (`TieredCache.flush`); returns the number of pages dropped."""

    @abstractmethod
    async def pin(self, namespace: str, prompt_ids: tuple[int, ...]) -> dict:
        """Compute the prompt if need be and pin its full pages (at least on host from now
        on): {"pinned_tokens", "pinned_pages", "namespace_pinned_pages", "budget_pages",
        "owner_pinned_pages", "total_pinned_pages", "total_budget_pages"} (the owner: the
        namespace's tenant, all its namespaces together, `tieredkv.tenants`). PinError (a
        RequestError) when it may not be pinned."""

    @abstractmethod
    async def unpin(self, namespace: str, prompt_ids: tuple[int, ...]) -> bool:
        """Release a pin; False when the prompt was not pinned in `namespace`."""

    @abstractmethod
    async def list_pins(self) -> dict:
        """Every pin of every namespace: {"pins": [{"namespace", "token_ids", "pinned_pages",
        "held"}], "budget_pages", "total_pinned_pages", "total_budget_pages"}; `held` is False
        for a pin saved by an earlier run and not pinned again yet."""

    @abstractmethod
    def pins_to_restore(self) -> list[tuple[str, tuple[int, ...]]]:
        """Pins saved by an earlier run that are not pinned again yet (namespace, prompt)."""

    @abstractmethod
    async def debug_cache(self) -> dict:
        """check_integrity() computed on the engine thread, plus page counts per tier/owner."""

    @abstractmethod
    def health(self) -> dict:
        """{"ready": bool, "tiers": {"device": "healthy"|"degraded"|"disabled", ...},
        "tier_capacity_bytes": {"device": int, ...} (the capacities in effect),
        "direct_io": bool | None (whether the disk tier uses O_DIRECT; None: no disk tier)}"""

    @abstractmethod
    def render_metrics(self) -> str:
        """The Prometheus text exposition of every tieredkv_* metric."""

"""A request's state inside the engine (engine thread only).

Life: WAITING (queued; its disk pages prefetched towards host) → PROMOTING (admitted: its host
and disk prefix pages are on their way to the device) → RUNNING (prefill in chunks, then
decode) → FINISHED. Preemption sends a RUNNING request back to WAITING after its computed pages
went into the tree, so its next admission finds them there (or demoted, not lost).

Cache: `kv` is the request's handle on the tiered cache (its queued match, promotion, lock and
page table, where `page_table[i]` is the device page of the sequence's i-th page); the request
never sees the tree's nodes.

Forks: a request with `n` > 1 is one sequence (index 0) until its prompt is computed; the step
that samples its first token forks it into `n` sequences (`index` 1 .. n - 1 are requests of
their own from then on, sharing the prompt's pages; see `Engine`).

Tokens: `tokens` is the sequence as ids; `packed_tokens` the same sequence packed (what the
tree compares), kept incrementally: the prompt is packed once at arrival, generated tokens are
appended as they show up in `output_ids`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.index.token_run import PackedTokens, TokenPacker
from tieredkv.cache.tier import Tier
from tieredkv.engine.output import OutputProcessor
from tieredkv.engine.protocol import FinishReason, GenerationRequest, Usage
from tieredkv.model.logprobs import TokenLogprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    PROMOTING = "promoting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    spec: GenerationRequest
    seq_id: int
    output: OutputProcessor
    generator: torch.Generator | None
    kv: CacheHandle
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    kv_len: int = 0  # tokens whose K/V are in page_table's pages
    # accounting (engine clock)
    cached_tokens: int = 0
    cached_by_tier: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(Tier, 0))
    admitted_at: float | None = None
    first_forward_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    promotion_seconds: float | None = None  # admission to prefix ready, first admission
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    # scheduling: seconds it waited for a running request computing a prefix it shares, and
    # since when it has been waiting so (None: it was not, at its last admission attempt)
    deferred_s: float = 0.0
    deferred_at: float | None = None
    prompt_page_hashes: list[int] | None = None  # admission's chained page hashes, once
    index: int = 0  # which of the request's n sequences this is
    unforked: int = 0  # sequences still to fork from this one (n - 1 until its first token)
    # echo: the logprob of each prompt token given the ones before it (None: not yet known)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    _packer: TokenPacker = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._packer = TokenPacker(self.spec.prompt_ids)  # packed once, at arrival
        if self.spec.sampling.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None] * len(self.spec.prompt_ids)

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def key(self) -> str:
        """The sequence's own name in the engine: the request id, then `id/1` .. `id/n-1`."""
        return self.request_id if self.index == 0 else f"{self.request_id}/{self.index}"

    @property
    def needs_prompt_logits(self) -> bool:
        """Echo with logprobs: prompt positions still to score. The cache keeps K/V, not
        logits, so until they are scored the prompt is computed, not taken from the cache."""
        return self.prompt_logprobs is not None and self.kv_len < len(self.spec.prompt_ids)

    @property
    def tokens(self) -> list[int]:
        """Prompt + generated tokens: what the sequence's KV covers once computed."""
        return [*self.spec.prompt_ids, *self.output_ids]

    def token_slice(self, start: int, end: int) -> list[int]:
        """`tokens[start:end]` without building the whole sequence (the step's hot path)."""
        prompt = self.spec.prompt_ids
        if end <= len(prompt):
            return list(prompt[start:end])
        outputs = self.output_ids[max(start - len(prompt), 0) : end - len(prompt)]
        return [*prompt[start:], *outputs] if start < len(prompt) else outputs

    @property
    def packed_tokens(self) -> PackedTokens:
        """`tokens`, packed; only tokens generated since the last call are packed now."""
        packer, prompt_len = self._packer, len(self.spec.prompt_ids)
        packed_outputs = len(packer) - prompt_len
        assert packed_outputs <= len(self.output_ids), "output_ids only grow"
        packer.extend(self.output_ids[packed_outputs:])
        return packer.packed()

    @property
    def num_tokens(self) -> int:
        return len(self.spec.prompt_ids) + len(self.output_ids)

    @property
    def page_table(self) -> list[int]:
        return self.kv.page_table

    @property
    def num_pending(self) -> int:
        """Tokens still to forward; the step that forwards the last of them samples."""
        return self.num_tokens - self.kv_len

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=len(self.spec.prompt_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens,
            cached_tokens_by_tier={tier.label: n for tier, n in self.cached_by_tier.items()},
        )

"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeded, after the
request's own logit changes (`logits_processing`: logit_bias, penalties, banned tokens).

Greedy rows of a batch take one argmax together; sampled rows each draw from their own
generator, so a seeded request yields the same tokens whatever else shares its batch. The
sequences of a request with `n` > 1 are its forks: fork `i` draws from a generator seeded with
`seed + i`, so each equals a request of its own with that seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tieredkv.errors import RequestError
from tieredkv.model.logits_processing import processed_logits
from tieredkv.model.logprobs import MAX_TOP_LOGPROBS

MAX_N = 128  # sequences of one request (OpenAI's limit for n)
MAX_LOGIT_BIAS = 100.0  # |bias|, OpenAI's range
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty|, OpenAI's range


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. Validated: a bad value is a RequestError (HTTP 400)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1  # sequences sampled from the one prompt (forks sharing its pages)
    logprobs: int | None = None  # None: none; k: each sampled token's logprob and the top k
    prompt_logprobs: int | None = None  # the same for each prompt token (echo)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")
        if not 0.0 <= self.temperature <= 100.0:
            raise RequestError(
                f"temperature must be in [0, 100], got {self.temperature}", "temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", "top_k")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
                "min_tokens",
            )
        if not 1 <= self.n <= MAX_N:
            raise RequestError(f"n must be in [1, {MAX_N}], got {self.n}", "n")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_TOP_LOGPROBS:
                raise RequestError(f"{name} must be in [0, {MAX_TOP_LOGPROBS}], got {value}", name)
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                message = f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}]"
                raise RequestError(f"{message}, got {getattr(self, name)}", name)
        for token, bias in self.logit_bias:
            if token < 0 or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                message = f"logit_bias maps token ids >= 0 to values in [-100, 100], got {token}"
                raise RequestError(f"{message}: {bias}", "logit_bias")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Turns a batch of fp32 logits into token ids, one `SamplingParams` per row."""

    def __init__(self, seed: int | None = None) -> None:
        self._unseeded = torch.Generator()
        if seed is not None:
            self._unseeded.manual_seed(seed)
        else:
            self._unseeded.seed()

    def new_generator(self, params: SamplingParams, fork: int = 0) -> torch.Generator | None:
        """A sequence's own generator (seeded with `seed + fork`), or None to share the
        sampler's unseeded one."""
        if params.greedy or params.seed is None:
            return None
        generator = torch.Generator()
        generator.manual_seed((params.seed + fork) % 2**64)  # manual_seed takes [0, 2**64)
        return generator

    def sample(
        self,
        logits: torch.Tensor,  # (B, vocab) fp32
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        banned: Sequence[frozenset[int]] | None = None,
        outputs: Sequence[Sequence[int]] | None = None,
    ) -> list[int]:
        """One token per row. `banned[i]` token ids get no probability (min_tokens);
        `outputs[i]`, the row's tokens so far, drive its penalties."""
        logits = processed_logits(logits.float(), params, banned, outputs)
        tokens = logits.argmax(dim=-1).tolist()
        for row, p in enumerate(params):
            if not p.greedy:
                tokens[row] = self._draw(logits[row], p, generators[row] or self._unseeded)
        return tokens

    def sample_isolated(
        self,
        logits: torch.Tensor,  # (B, vocab) fp32
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        banned: Sequence[frozenset[int]],
        outputs: Sequence[Sequence[int]],
    ) -> list[int | Exception]:
        """`sample`, but a row that fails yields its exception instead of failing the batch
        (one request's parameters must not end the others in its step)."""
        try:
            return list(self.sample(logits, params, generators, banned, outputs))
        except Exception:  # retried row by row below, to find the culprit
            pass
        results: list[int | Exception] = []
        for row in range(logits.shape[0]):
            try:
                one = self.sample(
                    logits[row : row + 1],
                    [params[row]],
                    [generators[row]],
                    [banned[row]],
                    [outputs[row]],
                )
                results.append(one[0])
            except Exception as error:  # reported to that request alone
                results.append(error)
        return results

    @staticmethod
    def _draw(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
        # the max first, and no temperature below the dtype's smallest normal (fp32 rounds
        # 1e-300 to 0): a tiny temperature then sends the others to -inf, not the top to inf
        temperature = max(p.temperature, torch.finfo(logits.dtype).tiny)
        logits = (logits - logits.max()) / temperature  # (vocab,)
        if p.top_k:
            k = min(p.top_k, logits.shape[-1])
            kth = torch.topk(logits, k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = sorted_logits.softmax(-1)
            # drop a token when the tokens before it already cover top_p; the first always stays
            drop = probs.cumsum(-1) - probs >= p.top_p
            drop[0] = False  # even when top_p rounds to 0 in fp32 (1e-300)
            logits = logits.index_put((order[drop],), torch.tensor(float("-inf")))
        probs = logits.softmax(-1)
        return int(torch.multinomial(probs, 1, generator=generator).item())

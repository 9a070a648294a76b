"""What a request changes in its logits before a token is drawn: `logit_bias`, presence and
frequency penalties, and tokens it may not sample yet (stop tokens before `min_tokens`).

As OpenAI documents them: a bias is added to the logit of its token; a token that has appeared
in the request's output so far loses `presence_penalty` once and `frequency_penalty` per
appearance (the prompt does not count, as in vLLM). Applied to a copy: the raw logits stay
what logprobs are computed from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tieredkv.model.sampler import SamplingParams


def needs_processing(params: SamplingParams, banned: frozenset[int]) -> bool:
    return bool(banned or params.logit_bias or params.presence_penalty or params.frequency_penalty)


def processed_logits(
    logits: torch.Tensor,  # (B, vocab) fp32
    params: Sequence[SamplingParams],
    banned: Sequence[frozenset[int]] | None,
    outputs: Sequence[Sequence[int]] | None,
) -> torch.Tensor:
    """`logits`, or a processed copy when a row asks for any processing."""
    rows = [
        row
        for row, p in enumerate(params)
        if needs_processing(p, banned[row] if banned is not None else frozenset())
    ]
    if not rows:
        return logits
    logits = logits.clone()
    for row in rows:
        p = params[row]
        if p.logit_bias:
            ids = torch.tensor([token for token, _ in p.logit_bias], dtype=torch.int64)
            bias = torch.tensor([value for _, value in p.logit_bias], dtype=logits.dtype)
            logits[row].index_add_(0, ids, bias)
        if (p.presence_penalty or p.frequency_penalty) and outputs is not None and outputs[row]:
            seen, counts = torch.tensor(list(outputs[row])).unique(return_counts=True)
            penalty = p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty
            logits[row].index_add_(0, seen, -penalty)
        if banned is not None and banned[row]:
            logits[row, list(banned[row])] = float("-inf")
    return logits

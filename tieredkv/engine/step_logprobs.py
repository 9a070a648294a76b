"""The logprobs a step reports, from the raw logits of its rows: each sampled token's (a
request's `logprobs`) and the prompt's (echo with `prompt_logprobs`, scored chunk by chunk as
the prompt is computed)."""

from __future__ import annotations

import torch

from tieredkv.engine.request import Request
from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.logprobs import TokenLogprob, token_logprobs


def score_prompt(request: Request, chunk: SequenceChunk, rows: torch.Tensor) -> None:
    """Prompt logprobs of the positions after this chunk's tokens (row j of `rows`, the
    logits at position start + j, scores the prompt token at start + j + 1)."""
    assert request.prompt_logprobs is not None
    prompt = request.spec.prompt_ids
    targets = prompt[chunk.start + 1 : min(chunk.end + 1, len(prompt))]
    top = request.spec.sampling.prompt_logprobs or 0
    scored = token_logprobs(rows[: len(targets)], targets, [top] * len(targets))
    request.prompt_logprobs[chunk.start + 1 : chunk.start + 1 + len(scored)] = scored


def sampled_logprobs(
    raw: torch.Tensor, sampled: list[tuple[Request, int]], tokens: list[int | Exception]
) -> list[TokenLogprob | None]:
    """The sampled tokens' logprobs (row i of `raw` sampled `tokens[i]` for `sampled[i]`, a
    request and its fork), for the rows whose request asked; None for the others."""
    wanted = [
        i
        for i, (request, _) in enumerate(sampled)
        if request.spec.sampling.logprobs is not None and not isinstance(tokens[i], Exception)
    ]
    result: list[TokenLogprob | None] = [None] * len(sampled)
    if wanted:
        top = [sampled[i][0].spec.sampling.logprobs or 0 for i in wanted]
        scored = token_logprobs(raw[wanted], [tokens[i] for i in wanted], top)
        for i, logprob in zip(wanted, scored, strict=True):
            result[i] = logprob
    return result

"""Log-probabilities of tokens, as the OpenAI API reports them.

The values are the log-softmax of the model's own logits in fp32 (before temperature, top-k/p,
`logit_bias` or penalties: what vLLM reports by default as "raw" logprobs), so a token's
logprob does not depend on how it was sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token there, its logprob, and the `top` most likely (id, logprob)
    pairs at that position, the most likely first (empty unless asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], top: Sequence[int]
) -> list[TokenLogprob]:
    """Row `i` of `logits` (R, vocab) scored at `token_ids[i]`, with its `top[i]` best tokens."""
    if not token_ids:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(list(token_ids), dtype=torch.int64, device=logprobs.device)
    chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
    k = max(top)
    best_ids: list[list[int]] = [[] for _ in token_ids]
    best_values: list[list[float]] = [[] for _ in token_ids]
    if k > 0:
        values, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        best_ids, best_values = indices.tolist(), values.tolist()
    return [
        TokenLogprob(
            token_id,
            chosen[row],
            tuple(zip(best_ids[row][: top[row]], best_values[row][: top[row]], strict=True)),
        )
        for row, token_id in enumerate(token_ids)
    ]

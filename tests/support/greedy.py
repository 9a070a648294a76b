"""`generate_greedy`: one sequence generated greedily on a `ModelRunner`, without the cache."""

from __future__ import annotations

from collections.abc import Sequence

from tieredkv.model.runner import ModelRunner, PagedSequence


def generate_greedy(
    runner: ModelRunner,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_token_ids: frozenset[int] = frozenset(),
    prefill_chunk: int | None = None,
    seq_id: int = 0,
) -> list[int]:
    """Greedy generation of one sequence, without the cache."""
    seq = PagedSequence(seq_id, list(prompt_ids))
    output: list[int] = []
    try:
        while True:
            logits = runner.forward([seq.next_chunk(runner.pool, prefill_chunk)])
            if seq.kv_len < len(seq.token_ids):
                continue  # more prefill chunks to go
            token = int(logits[0].argmax())
            output.append(token)
            if token in stop_token_ids or len(output) >= max_new_tokens:
                return output
            seq.token_ids.append(token)
    finally:
        runner.release(seq_id)
        seq.free(runner.pool)

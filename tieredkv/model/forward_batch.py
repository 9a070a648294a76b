"""What one forward step computes: new tokens of several sequences, flattened.

A sequence contributes a chunk of new tokens that follow `start` tokens already in its KV pages
(a cached prefix, earlier prefill chunks, or earlier decode steps). Prefill, suffix-after-prefix,
chunked prefill and decode are all the same shape: decode is a chunk of one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceChunk:
    """The new tokens of one sequence in one step."""

    seq_id: int
    token_ids: Sequence[int]
    start: int  # tokens of this sequence already in its KV pages
    page_ids: Sequence[int]  # device pages covering at least start + len(token_ids) tokens

    @property
    def num_new(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class ForwardBatch:
    """Flattened tensors for one step. T = total new tokens, B = number of sequences."""

    chunks: tuple[SequenceChunk, ...]
    token_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64, absolute position of each new token
    slot_mapping: torch.Tensor  # (T,) int64, page * page_size + offset in the device pool
    query_start: torch.Tensor  # (B + 1,) int32, cumulative offsets of each chunk in the T axis
    logits_indices: torch.Tensor  # (B,) int64, index of each chunk's last token
    page_size: int

    @classmethod
    def build(
        cls, chunks: Sequence[SequenceChunk], page_size: int, device: torch.device | str = "cpu"
    ) -> ForwardBatch:
        if not chunks:
            raise ValueError("ForwardBatch needs at least one chunk")
        positions, slots, offsets, token_ids = [], [], [0], []
        for chunk in chunks:
            assert chunk.num_new > 0, f"sequence {chunk.seq_id}: empty chunk"
            assert len(chunk.page_ids) * page_size >= chunk.end, (
                f"sequence {chunk.seq_id}: {len(chunk.page_ids)} pages of {page_size} "
                f"cannot hold {chunk.end} tokens"
            )
            pos = torch.arange(chunk.start, chunk.end, dtype=torch.int64)
            pages = torch.as_tensor(chunk.page_ids, dtype=torch.int64)
            positions.append(pos)
            slots.append(pages[pos // page_size] * page_size + pos % page_size)
            offsets.append(offsets[-1] + chunk.num_new)
            token_ids.extend(chunk.token_ids)
        query_start = torch.tensor(offsets, dtype=torch.int32)
        return cls(
            chunks=tuple(chunks),
            token_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
            positions=torch.cat(positions).to(device),
            slot_mapping=torch.cat(slots).to(device),
            query_start=query_start.to(device),
            logits_indices=(query_start[1:].to(torch.int64) - 1).to(device),
            page_size=page_size,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return all(chunk.num_new == 1 for chunk in self.chunks)

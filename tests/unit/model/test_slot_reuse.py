"""A new sequence whose cached prefix a released workspace slot still holds starts from that
slot instead of copying the prefix from the pool: the same logits, to the bit."""

from __future__ import annotations

import pytest
import torch

from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.loader import LoadedModel
from tieredkv.model.runner import ModelRunner, PagedSequence


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_turn_from_the_slot_its_history_left_equals_one_filled_from_the_pool(
    default_model: LoadedModel, dtype: torch.dtype
) -> None:
    weights = {name: t.to(dtype) for name, t in default_model.weights.items()}
    runner = ModelRunner.create(default_model.config, weights, num_pages=64, max_model_len=512)
    generator = torch.Generator().manual_seed(5)
    history = torch.randint(100, 40000, (200,), generator=generator).tolist()
    question = torch.randint(100, 40000, (40,), generator=generator).tolist()
    first = PagedSequence(0, history)
    runner.forward([first.next_chunk(runner.pool)])
    cached = first.page_ids[:12]  # 192 tokens in whole pages: what the tree would match
    arena = runner.attention._arena
    assert arena is not None

    def turn(seq_id: int) -> torch.Tensor:
        pages = [*cached, *runner.pool.alloc(3)]
        logits = runner.forward([SequenceChunk(seq_id, history[192:] + question, 192, pages)])
        runner.release(seq_id)
        runner.pool.free(pages[12:])
        return logits

    filled = turn(1)  # the history's sequence still holds its slot: the turn copies the prefix
    assert arena.reused_tokens == 0
    runner.release(0)
    reused = turn(2)
    assert arena.reused_tokens == 192
    assert torch.equal(reused, filled)
    runner.close()

"""Threads have owners: a closed model runner leaves no workspace fill thread behind."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import transformers

from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.hf_config import parse_model_config
from tieredkv.model.runner import ModelRunner, PagedSequence
from tieredkv.model.workspace import FILL_THREAD_PREFIX


def fill_threads(before: set[threading.Thread]) -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith(FILL_THREAD_PREFIX)
    ]


def tiny_runner() -> ModelRunner:
    hf_config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config)
    config = parse_model_config(hf_config.to_dict(), Path("tiny"))
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return ModelRunner.create(config, weights, num_pages=80, page_size=16, max_model_len=1024)


def test_a_closed_runner_leaves_no_fill_thread() -> None:
    before = set(threading.enumerate())
    runner = tiny_runner()
    prompt = torch.randint(0, 97, (608,), generator=torch.Generator().manual_seed(1)).tolist()
    seq = PagedSequence(0, prompt)
    runner.forward([seq.next_chunk(runner.pool)])
    # the same pages as a cached prefix of a new sequence while the first still holds its
    # workspace: the new one is filled from the pool, a prefix this long on two threads
    runner.forward([SequenceChunk(1, prompt[600:], 600, seq.page_ids)])
    assert fill_threads(before), "the fill never used its helper thread"
    runner.release(0)
    runner.release(1)
    runner.close()
    assert fill_threads(before) == []

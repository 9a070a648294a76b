"""The default model (fp32): our paged forward pass generates what transformers generates.

A divergence is accepted only at a near-tie, where transformers' top-two logits differ by less
than 1e-4, and is reported.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from tests.support.greedy import generate_greedy
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner

NEAR_TIE = 1e-4
NEW_TOKENS = 64
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
    [
        {"role": "system", "content": "You are a terse assistant who answers in one line."},
        {"role": "user", "content": "Explain what a hash table is."},
    ],
    [
        {"role": "user", "content": "Give me three tips for learning Python."},
        {"role": "assistant", "content": "1. Practice daily. 2. Read code. 3. Build projects."},
        {"role": "user", "content": "Expand on the second tip."},
    ],
    [{"role": "user", "content": "Translate 'good morning, my friend' into Spanish and German."}],
]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype=torch.float32)


@pytest.fixture(scope="module")
def hf_model(loaded: LoadedModel) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(loaded.model_dir, dtype=torch.float32)
    return model.eval()


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def top_two_gap(model: transformers.PreTrainedModel, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_same_or_near_tie(
    model: transformers.PreTrainedModel, prompt: list[int], ours: list[int], theirs: list[int]
) -> None:
    at = first_divergence(ours, theirs)
    if at is None:
        return
    gap = top_two_gap(model, prompt + theirs[:at])
    assert gap < NEAR_TIE, (
        f"diverged at token {at} (ours {ours[at : at + 3]}, transformers {theirs[at : at + 3]}) "
        f"where transformers' top-two logits differ by {gap:.2e}"
    )
    warnings.warn(f"accepted divergence at token {at}: near-tie gap {gap:.2e}", stacklevel=2)


@pytest.mark.parametrize("messages", PROMPTS, ids=[f"prompt{i}" for i in range(len(PROMPTS))])
def test_greedy_64_tokens_match_transformers(
    loaded: LoadedModel, hf_model: transformers.PreTrainedModel, messages: list[dict]
) -> None:
    tokenizer = loaded.tokenizer
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    stops = tokenizer.stop_token_ids
    runner = ModelRunner.create(loaded.config, loaded.weights, num_pages=64, max_model_len=1024)
    ours = generate_greedy(runner, prompt, NEW_TOKENS, stop_token_ids=stops)
    with torch.no_grad():
        generated = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=sorted(stops),
            pad_token_id=tokenizer.eos_token_id,
        )
    theirs = generated[0, len(prompt) :].tolist()
    assert len(ours) > 4, "generation stopped at once: the comparison would say nothing"
    assert_same_or_near_tie(hf_model, prompt, ours, theirs)
    assert runner.pool.num_used == 0

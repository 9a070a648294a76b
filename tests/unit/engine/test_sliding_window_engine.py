"""Mistral and Qwen2 with a short sliding window, served by the engine over the tiered cache:
greedy tokens equal transformers' (fp32, eager attention, no KV cache: every step recomputes
the whole sequence under transformers' own sliding mask) for prompts longer than the window,
cold, with a reused prefix from the device, host and disk, through chunked prefill and
batching with other sequences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tests.model_factory import make_tiny_model_dir
from tests.support.greedy import generate_greedy
from tests.unit.engine.conftest import prompt, pushed_to_disk
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner

# Mistral: every layer slides; Qwen2: layer 0 full, layer 1 sliding (max_window_layers=1)
MODELS = {
    "mistral-32": ("mistral", {"sliding_window": 32}),
    "qwen2-48": (
        "qwen2",
        {"sliding_window": 48, "use_sliding_window": True, "max_window_layers": 1},
    ),
}


@pytest.fixture(scope="module", params=list(MODELS))
def sliding_model_dir(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    arch, overrides = MODELS[request.param]
    return make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch, init_std=0.5,
                               **overrides)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_model(sliding_model_dir: Path) -> LoadedModel:
    """The engine harness's model (conftest's `make_harness` builds on it)."""
    loaded = load_model(sliding_model_dir, dtype=torch.float32)
    assert loaded.config.has_sliding_layers
    return loaded


@pytest.fixture(scope="module")
def hf_model(sliding_model_dir: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(
        sliding_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def hf_greedy(model: transformers.PreTrainedModel, ids: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy tokens, recomputing the whole sequence each step."""
    tokens = list(ids)
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0, -1]
            tokens.append(int(logits.argmax()))
    return tokens[len(ids) :]


def test_cold_prompts_longer_than_the_window_batched_and_chunked(make_harness, hf_model) -> None:
    prompts = {f"r{i}": prompt(70 + 9 * i, seed=200 + i) for i in range(3)}
    harness = make_harness(max_batch_tokens=24)  # each prompt in chunks, beside the others
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens=8)
    harness.run()
    for request_id, ids in prompts.items():
        assert harness.tokens(request_id) == hf_greedy(hf_model, ids, 8), request_id


def test_a_prefix_reused_from_the_device(make_harness, hf_model) -> None:
    history = prompt(90, seed=210)
    harness = make_harness(max_batch_tokens=32)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    again = [*history, *prompt(7, seed=211)]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["device"] == 88
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)


def test_a_prefix_reused_from_host(make_harness, hf_model) -> None:
    history = prompt(60, seed=220)
    harness = make_harness(device_pages=40, host_pages=128)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(4):  # other conversations push it out of the device
        harness.submit(f"other{i}", prompt(60, seed=230 + i), max_tokens=2)
        harness.run()
    again = [*history, 7, 8]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["host"] > 0
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)


def test_a_prefix_reused_from_disk(make_harness, hf_model) -> None:
    history = prompt(60, seed=240)
    harness = pushed_to_disk(make_harness, history)
    again = [*history, 7, 8]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["disk"] > 0
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)


@pytest.mark.parametrize("backend", ["workspace", "reference"])
def test_the_runner_alone_matches_transformers(tiny_model, hf_model, backend) -> None:
    """Both CPU backends (the workspace path and the paged reference kernels), chunked."""
    runner = ModelRunner.create(
        tiny_model.config, tiny_model.weights, num_pages=64, page_size=16,
        max_model_len=256, attention_backend=backend,
    )  # fmt: skip
    try:
        ids = prompt(100, seed=250)
        ours = generate_greedy(runner, ids, 10, prefill_chunk=40)
    finally:
        runner.close()
    assert ours == hf_greedy(hf_model, ids, 10)

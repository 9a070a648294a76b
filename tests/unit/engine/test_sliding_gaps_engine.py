"""Host copies that lack the sliding part of the pages the rule drops, through the real engine:
the dropped parts are poisoned with NaN in the host pool, and a request reusing the prefix from
host (the match cut where its window would read a dropped part) still gives transformers' greedy
tokens (fp32, eager), for Mistral, Qwen2 and Gemma 3 with short windows and prompts several
windows long."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.model_factory import make_tiny_model_dir
from tests.unit.engine.conftest import PAGE_SIZE, Harness, prompt
from tests.unit.engine.test_sliding_window_engine import MODELS, hf_greedy
from tests.unit.model.test_qwen3_gemma3_forward import tiny_family_model
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.sliding_pages import window_pages
from tieredkv.cache.tier import Tier
from tieredkv.model.loader import LoadedModel, load_model


@pytest.fixture(scope="module", params=[*MODELS, "gemma3-16"])
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory) -> LoadedModel:
    """Overrides the engine tests' tiny Llama: the harness runs this model."""
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "gemma3-16":
        model_dir = tiny_family_model(directory, "gemma3", sliding_window=16)
    else:
        arch, overrides = MODELS[request.param]
        model_dir = make_tiny_model_dir(directory, arch, init_std=0.5, **overrides)
    loaded = load_model(model_dir, dtype=torch.float32)
    assert loaded.config.has_sliding_layers
    return loaded


@pytest.fixture(scope="module")
def hf_model(tiny_model: LoadedModel) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model.model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def drop_and_poison(harness: Harness, tokens: list[int], model: LoadedModel) -> set[int]:
    """Drop the sliding parts the rule keeps for no reuse point from the host copies of
    `tokens`' path and fill those layers with NaN; returns the poisoned pages' indexes in the
    path."""
    cache = harness.cache
    parts = PageParts.of(model.config, cache.layout)
    host_kv = cache.pools.host.kv  # (pages, layers, 2, page_size, kv_heads, head_dim)
    match = cache.match(tokens, "")
    first = match.device.num_pages  # the host segment's first page in the path
    poisoned: set[int] = set()
    for node in match.host.nodes:
        gaps = sorted(cache.residency.drop_sliding_parts(node, Tier.HOST))
        pages = [node.residence.copies[Tier.HOST][index] for index in gaps]
        if pages:
            rows = host_kv[pages]
            nan = torch.full((len(pages), *parts.part_shape(sliding=True)), float("nan"))
            parts.scatter(rows, nan, sliding=True)
            host_kv[pages] = rows
        poisoned.update(first + index for index in gaps)
        first += node.num_pages
    assert cache.check_integrity().ok
    return poisoned


def test_a_prefix_reused_from_host_copies_without_their_old_sliding_parts(
    make_harness, hf_model, tiny_model
) -> None:
    history = prompt(140, seed=260)
    harness = make_harness(device_pages=48, host_pages=160)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(5):  # other conversations push it out of the device
        harness.submit(f"other{i}", prompt(60, seed=270 + i), max_tokens=2)
        harness.run()
    again = [*history, 7, 8]
    match = harness.cache.match(again, "")
    assert match.host.num_pages > 0 and match.matched_len == 140
    poisoned = drop_and_poison(harness, again, tiny_model)
    assert poisoned
    harness.submit("again", again, max_tokens=8)
    harness.run()
    usage = harness.usage("again")
    assert usage.cached_tokens == 140 and usage.cached_tokens_by_tier["host"] > 0  # not cut
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)
    # a request diverging inside the history: its match is cut before any window that would
    # read a poisoned page (now on the device, promoted with its gaps)
    diverged = [*history[:50], *prompt(12, seed=280)]
    harness.submit("diverged", diverged, max_tokens=8)
    harness.run()
    reused = harness.usage("diverged").cached_tokens
    window = max(w for w in tiny_model.config.layer_windows if w is not None)
    assert reused <= 48 and not poisoned & set(window_pages(reused, window, PAGE_SIZE))
    if poisoned & set(window_pages(48, window, PAGE_SIZE)):
        assert reused < 48
    assert harness.tokens("diverged") == hf_greedy(hf_model, diverged, 8)

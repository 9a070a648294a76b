"""Host copies that lack the sliding part of the pages the rule drops, through the real engine,
for Mistral, Qwen2 and Gemma 3 with short windows and prompts several windows long: a request
reusing the prefix from host (the match cut where its window would read a dropped part) gives
transformers' greedy tokens (fp32, eager). In a whole-page host pool the dropped parts are
marked and poisoned with NaN; in the split host pool (no store below) they are never stored,
and the same bytes hold more pages of history."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.model_factory import make_tiny_model_dir
from tests.support.sliding_drop import drop_sliding_parts
from tests.unit.cache.cache_steps import settle
from tests.unit.engine.conftest import PAGE_SIZE, Harness, prompt
from tests.unit.engine.test_sliding_window_engine import MODELS, hf_greedy
from tests.unit.model.test_qwen3_gemma3_forward import tiny_family_model
from tieredkv.cache.disk.split_store import SplitDiskStore
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.sliding_pages import held_by_layer_kind, window_pages
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
        gaps = sorted(drop_sliding_parts(cache.residency, node, Tier.HOST))
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


def pushed_to_host(harness: Harness, history: list[int], others: int) -> None:
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(others):  # other conversations push it out of the device
        harness.submit(f"other{i}", prompt(60, seed=270 + i), max_tokens=2)
        harness.run()


def reuse_and_diverge(
    harness: Harness, history: list[int], hf_model, window: int, poisoned: set[int]
) -> None:
    """A request continuing the whole history (a reuse point: nothing cut), then one diverging
    inside it (cut before any window reading a page without its sliding part)."""
    again = [*history, 7, 8]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    usage = harness.usage("again")
    assert usage.cached_tokens == 140 and usage.cached_tokens_by_tier["host"] > 0
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)
    diverged = [*history[:50], *prompt(12, seed=280)]
    harness.submit("diverged", diverged, max_tokens=8)
    harness.run()
    reused = harness.usage("diverged").cached_tokens
    assert reused <= 48 and not poisoned & set(window_pages(reused, window, PAGE_SIZE))
    if poisoned & set(window_pages(48, window, PAGE_SIZE)):
        assert reused < 48
    assert harness.tokens("diverged") == hf_greedy(hf_model, diverged, 8)


def longest_window(model: LoadedModel) -> int:
    return max(w for w in model.config.layer_windows if w is not None)


def test_a_whole_page_host_copy_with_dropped_parts_poisoned(
    make_harness, hf_model, tiny_model
) -> None:
    history = prompt(140, seed=260)
    harness = make_harness(device_pages=48, host_pages=160)
    assert type(harness.cache.pools.host) is HostPool  # whole pages
    pushed_to_host(harness, history, others=5)
    again = [*history, 7, 8]
    match = harness.cache.match(again, "")
    assert match.host.num_pages > 0 and match.matched_len == 140
    poisoned = drop_and_poison(harness, again, tiny_model)
    assert poisoned
    reuse_and_diverge(harness, history, hf_model, longest_window(tiny_model), poisoned)


def test_a_split_host_pool_stores_no_dropped_part_and_holds_more_history(
    make_harness, hf_model, tiny_model
) -> None:
    history = prompt(140, seed=260)
    harness = make_harness(device_pages=48, host_pages=160, split_host=True)
    cache = harness.cache
    host = cache.pools.host
    assert isinstance(host, SplitHostPool)
    whole_pages = cache.tier_capacity_bytes(Tier.HOST) // cache.layout.page_bytes
    assert host.num_pages > whole_pages  # the same bytes, more pages
    pushed_to_host(harness, history, others=5)
    pages, sliding = cache.tier_parts_held(Tier.HOST)
    assert sliding < pages  # the pages no reuse point reads hold only their full part
    assert pages * cache.layout.page_bytes > host.used_bytes  # more pages than whole ones fit
    kinds = held_by_layer_kind(tiny_model.config, cache.layout, cache.tier_parts_held)  # /health
    assert kinds["full"]["tokens_by_tier"]["host"] == pages * PAGE_SIZE
    assert kinds["sliding"]["tokens_by_tier"]["host"] == sliding * PAGE_SIZE
    again = [*history, 7, 8]
    match = cache.match(again, "")
    assert match.host.num_pages > 0 and match.matched_len == 140
    first = match.device.num_pages
    dropped: set[int] = set()
    for node in match.host.nodes:
        dropped.update(first + i for i in node.residence.sliding_gaps.get(Tier.HOST, ()))
        first += node.num_pages
    assert dropped  # the rule's drops: those pages' sliding layers are nowhere in host
    reuse_and_diverge(harness, history, hf_model, longest_window(tiny_model), dropped)


@pytest.mark.parametrize("split_disk", [False, True])
def test_a_split_host_pool_writes_its_gaps_to_the_disk_below(
    make_harness, hf_model, tiny_model, split_disk: bool
) -> None:
    """With a disk below, the split host pool's copies go down with their gaps in the records
    (whole-page records flagged, or, split, no record of the missing layers); a history that
    left host is reused from disk as transformers would continue it, the match cut where a
    window would read a part the records say is missing."""
    history = prompt(140, seed=260)
    harness = make_harness(
        device_pages=48, host_pages=96, disk_pages=800, split_host=True, split_disk=split_disk
    )
    cache = harness.cache
    assert isinstance(cache.pools.host, SplitHostPool)
    assert isinstance(cache.pools.disk, SplitDiskStore) == split_disk
    pushed_to_host(harness, history, others=8)
    while not cache.evict(Tier.HOST, cache.tier_num_pages(Tier.HOST)):  # down to disk
        settle(cache, harness.executor)  # write-back: freed once the copies down are applied
    again = [*history, 7, 8]
    match = cache.match(again, "")
    assert match.matched_len == 140 and match.disk.num_pages == 35  # all of it, from disk
    gapped: set[int] = set()
    first = 0
    for node in match.disk.nodes:
        gapped.update(first + i for i in node.residence.sliding_gaps.get(Tier.DISK, ()))
        first += node.num_pages
    assert gapped  # written from host copies without the parts the rule dropped
    copies = [n.residence for n in cache.residency.tree.iter_nodes()]
    gaps = sum(len(r.sliding_gaps.get(Tier.DISK, ())) for r in copies if Tier.DISK in r.copies)
    pages, sliding = cache.tier_parts_held(Tier.DISK)
    assert sliding == (pages - gaps if split_disk else pages)  # split: none stored for a gap
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens == 140  # from disk (prefetched through host)
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)
    diverged = [*history[:50], *prompt(12, seed=280)]
    harness.submit("diverged", diverged, max_tokens=8)
    harness.run()
    reused = harness.usage("diverged").cached_tokens
    window = longest_window(tiny_model)
    assert not gapped & set(window_pages(reused, window, PAGE_SIZE))
    assert harness.tokens("diverged") == hf_greedy(hf_model, diverged, 8)
    assert cache.check_integrity().ok

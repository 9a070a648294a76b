"""A split device pool through the real engine (Mistral and Qwen2 with short windows, Gemma 3):
the sliding parts a running sequence's window has passed, and those no reuse point reads once
it is done, are freed from the device, and every request still gives transformers' greedy
tokens (fp32, eager): long prompts computed in chunks, a continuation of the whole history, one
diverging inside it (cut where its window would read a freed part), on the workspace path and
on the paged kernels that read the pool in place."""

from __future__ import annotations

import pytest

from tests.unit.engine import test_sliding_gaps_engine as sliding_gaps
from tests.unit.engine.conftest import PAGE_SIZE, Harness, prompt
from tests.unit.engine.test_sliding_window_engine import hf_greedy
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES, window_pages
from tieredkv.cache.tier import Tier

HISTORY = 140
# the sliding-window models (Mistral, Qwen2, Gemma 3) and transformers' copies of them
tiny_model = sliding_gaps.tiny_model
hf_model = sliding_gaps.hf_model
longest_window = sliding_gaps.longest_window


class SlidingHeld:
    """The split device pool's sliding parts held after each engine step."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.after_steps: list[int] = []

    def run(self) -> None:
        pool = self.harness.cache.pools.device
        while self.harness.step():
            self.after_steps.append(pool.num_sliding_held)


def device_gaps_on_path(harness: Harness, tokens: list[int]) -> set[int]:
    match = harness.cache.match(tokens, "")
    gaps, first = set(), 0
    for node in match.device.nodes:
        gaps.update(first + index for index in node.residence.device_gaps())
        first += node.num_pages
    return gaps


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_split_device_frees_passed_sliding_parts_and_serves_transformers_tokens(
    make_harness, hf_model, tiny_model, backend: str
) -> None:
    harness = make_harness(device_pages=64, split_device=True, attention_backend=backend)
    cache = harness.cache
    device = cache.pools.device
    assert isinstance(device, SplitDevicePool)
    window = longest_window(tiny_model)
    history = prompt(HISTORY, seed=300)
    harness.submit("first", history, max_tokens=8)
    held = SlidingHeld(harness)
    held.run()
    assert harness.tokens("first") == hf_greedy(hf_model, history, 8)
    # while it ran, no more sliding parts than its window (and margin) and the step's chunk
    path_pages = -(-(HISTORY + 8) // PAGE_SIZE)
    bound = -(-(window - 1) // PAGE_SIZE) + REUSE_MARGIN_PAGES + 64 // PAGE_SIZE + 2
    assert max(held.after_steps) <= bound < path_pages
    pages, sliding = cache.tier_parts_held(Tier.DEVICE)
    assert sliding < pages
    gaps = device_gaps_on_path(harness, [*history, 7])
    assert gaps  # the path's device copy lacks the parts no reuse point reads
    again = [*history, *harness.tokens("first"), 7, 8]
    harness.submit("again", again, max_tokens=8)
    held.run()
    assert harness.usage("again").cached_tokens >= HISTORY  # the whole history, on device
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)
    diverged = [*history[:50], *prompt(12, seed=310)]
    harness.submit("diverged", diverged, max_tokens=8)
    held.run()
    reused = harness.usage("diverged").cached_tokens
    assert reused <= 48 and not gaps & set(window_pages(reused, window, PAGE_SIZE))
    assert harness.tokens("diverged") == hf_greedy(hf_model, diverged, 8)
    assert cache.check_integrity().ok


def test_a_split_device_holds_more_history_than_whole_pages(make_harness, tiny_model) -> None:
    """The same device bytes, conversations several windows long: the freed layer pages hold
    other pages, so more of the histories stay on the device."""
    held_pages = {}
    for split in (False, True):
        harness = make_harness(device_pages=64, split_device=split)
        for index in range(4):
            harness.submit(f"chat{index}", prompt(HISTORY, seed=320 + index), max_tokens=2)
            harness.run()
        held_pages[split] = harness.cache.tier_parts_held(Tier.DEVICE)[0]
        assert harness.cache.check_integrity().ok
    assert held_pages[True] > held_pages[False]


def test_a_split_device_runs_more_long_sequences_at_once_with_the_same_tokens(
    make_harness, tiny_model
) -> None:
    """Admission counts what running sequences' pages take: those that lost their sliding part
    take less, so the same device bytes run more long sequences at once (6, 3 and 4 against 2
    for Mistral, Qwen2 and Gemma 3 here), and every request gives the tokens it gives on whole
    pages."""
    prompts = [prompt(150, seed=330 + index) for index in range(6)]
    most_running, tokens = {}, {}
    for split in (False, True):
        harness = make_harness(
            device_pages=100, split_device=split, max_num_seqs=8, max_batch_tokens=64
        )
        for index, ids in enumerate(prompts):
            harness.submit(f"long{index}", ids, max_tokens=40)
        running, ids = [], [f"long{index}" for index in range(len(prompts))]
        for _ in range(3000):
            harness.step()
            running.append(harness.engine.scheduler.queue_sizes().running)
            if all(harness.finished(request_id) for request_id in ids):
                break
        most_running[split] = max(running)
        tokens[split] = [harness.tokens(f"long{index}") for index in range(len(prompts))]
        assert [len(t) for t in tokens[split]] == [40] * len(prompts)
        assert harness.cache.check_integrity().ok
    assert tokens[True] == tokens[False]
    assert most_running[True] > most_running[False]

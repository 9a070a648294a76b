"""Multi-turn histories under memory pressure: with room on disk, a conversation's computed
pages are demoted, never lost, whatever order the transfers finish in (seeded)."""

from __future__ import annotations

import random

import pytest

from tests.unit.engine.conftest import PAGE_SIZE, prompt
from tieredkv.cache.tier import Tier

USERS, ROUNDS, HISTORY = 5, 4, 60


@pytest.mark.parametrize("seed", range(6))
def test_every_round_reuses_the_whole_previous_turn(make_harness, seed: int) -> None:
    rng = random.Random(seed)
    # a device that holds one conversation and a half (the longest is 104 tokens: 26 pages), a
    # host of a quarter of one, a roomy disk
    harness = make_harness(device_pages=40, host_pages=6, disk_pages=600, max_num_seqs=1)
    harness.auto_complete = False
    executor, cache = harness.executor, harness.cache

    def finish_some() -> None:  # transfers finish in a random order, some late
        pending = executor.pending()
        for ticket in rng.sample(pending, rng.randrange(len(pending) + 1)):
            executor.complete(ticket)

    history = {user: prompt(HISTORY, seed=1000 * seed + user) for user in range(USERS)}
    for round_index in range(ROUNDS):
        for user in range(USERS):
            request_id = f"u{user}r{round_index}"
            ids = history[user] + prompt(rng.randrange(2, 7), seed=rng.randrange(10**6))
            harness.submit(request_id, ids, max_tokens=5)
            for _ in range(3000):
                harness.step()
                finish_some()
                if harness.finished(request_id):
                    break
            assert harness.finished(request_id)
            usage = harness.usage(request_id)
            if round_index:  # the previous turn's full pages (prompt + answer) come back
                computed = len(history[user]) - 1  # its last token was sampled, not forwarded
                expected = min(computed, len(ids) - 1) // PAGE_SIZE * PAGE_SIZE
                assert usage.cached_tokens == expected, (request_id, usage)
            history[user] = ids + harness.tokens(request_id)
    executor.complete_all()
    harness.engine.step()
    dropped = {t: cache.counters.evicted_pages[t, "dropped"] for t in (Tier.DEVICE, Tier.HOST)}
    assert dropped == {Tier.DEVICE: 0, Tier.HOST: 0}, dropped

"""Conversations kept warm (`sessions`): for the think time after a turn, a named
conversation's pages stay on host while other requests push everything else to disk; after
it, they are LRU pages like any other."""

from __future__ import annotations

from tests.unit.engine.conftest import prompt


def run_turn(harness, request_id: str, ids: list[int], **kw) -> list[int]:
    harness.submit(request_id, ids, max_tokens=4, **kw)
    harness.run()
    return harness.tokens(request_id)


def flood(harness, tag: str, count: int = 16) -> None:
    for i in range(count):
        run_turn(harness, f"{tag}{i}", prompt(40, seed=500 + 10 * i + len(tag)))


def next_turn_tiers(make_harness, session: str | None, think: float = 0.0) -> dict[str, int]:
    harness = make_harness(device_pages=24, host_pages=16, disk_pages=256)
    first = prompt(40, seed=77)
    answer = run_turn(harness, "t1", first, session=session)
    harness.clock.advance(think)
    flood(harness, "other")
    second = [*first, *answer, *prompt(6, seed=78)]
    harness.submit("t2", second, max_tokens=2, session=session)
    harness.run()
    harness.cache.close()  # the next harness of the test opens the same disk directory
    return harness.usage("t2").cached_tokens_by_tier


def test_a_named_conversation_stays_on_host_during_its_think_time(make_harness) -> None:
    warm = next_turn_tiers(make_harness, session="chat-1")
    assert warm["disk"] == 0 and warm["device"] + warm["host"] >= 40
    cold = next_turn_tiers(make_harness, session=None)  # the same turns, no session named
    assert cold["disk"] > 0, cold  # partly pushed to disk by the other requests


def test_after_the_think_time_it_is_lru_again(make_harness) -> None:
    harness_think = 120.0  # past the default 60 s think time before the other requests come
    expired = next_turn_tiers(make_harness, session="chat-1", think=harness_think)
    assert expired["disk"] > 0, expired

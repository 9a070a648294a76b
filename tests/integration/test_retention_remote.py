"""Retained prompts with a remote tier, through real `tieredkv serve` replicas sharing a real
Redis (the default model, fp32, greedy): a prompt sent with `prompt_cache_retention: "24h"` has
its pages in Redis with an expiry of about 24 h, a default prompt's pages carry none, the same
prompt sent again with "24h" starts its 24 h again; after a flood larger than every local tier,
a replica started with an empty disk answers it from Redis with the tokens first computed, and
its own retention of the prompt starts the pages' 24 h again."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.server_process import ServerProcess
from tests.integration.test_prompt_cache_fields import (
    MODEL,
    SYSTEM,
    TINY,
    client,
    complete,
    flood,
    full_pages,
    metric,
)
from tests.integration.test_server_e2e import document
from tests.redis_servers import RedisServer
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.retention import RETENTION_S

PAGE_SIZE = 16
DAY_MS = int(RETENTION_S * 1e3)
SLACK_MS = 300_000  # set within five minutes of the request on a busy test machine
WAIT_S = 120.0
# budgets 100x the default: this test checks what Redis holds and serves, not the speed
REMOTE = ["--remote-budget-scale", "100", "--session-think-time", "0"]


def retained_in_remote(server: ServerProcess, pages: int) -> float:
    """The retained-pages gauge for the remote tier once it reaches `pages` (30 s at most).
    The engine counts at most once a second, at a step, and the remote copies enter the index
    when the writer has stored them, which may be after the last request's step: a one-token
    request a second makes the next steps."""
    deadline = time.monotonic() + 30.0
    while True:
        found = metric(server, "tieredkv_retained_pages", 'tier="remote"')
        if found >= pages or time.monotonic() > deadline:
            return found
        time.sleep(1.0)  # test code: past the engine's counting period
        complete(server, "Say yes.")


def ask(server: ServerProcess, retention: str) -> tuple[str, dict]:
    """The handbook question through the SDK's chat call: its answer and usage."""
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=[*SYSTEM, {"role": "user", "content": "What does it say first?"}],
        max_tokens=8,
        temperature=0,
        prompt_cache_retention=retention,
    )
    return reply.choices[0].message.content, reply.usage.model_dump()


def expiries(redis: RedisServer) -> list[int]:
    """Every page's PTTL in ms (-1: no expiry)."""
    names = redis.cli("KEYS", KEY_PREFIX + "*").split()
    return [int(redis.cli("PTTL", name)) for name in names]


def in_a_day(found: list[int]) -> int:
    """How many expire about 24 h from now."""
    return sum(DAY_MS - SLACK_MS < ms <= DAY_MS for ms in found)


def once(redis: RedisServer, done: Callable[[list[int]], bool]) -> list[int]:
    """The pages' expiries once `done` accepts them (the writer thread sets them after the
    reply), or as they are after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not done(found := expiries(redis)) and time.monotonic() < deadline:
        time.sleep(0.5)  # test code: waiting for the server's writer thread
    return found


def age(redis: RedisServer) -> None:
    """Shorten every expiry to a minute, as if 23 hours had passed."""
    for name in redis.cli("KEYS", KEY_PREFIX + "*").split():
        if int(redis.cli("PTTL", name)) > 0:
            redis.cli("PEXPIRE", name, "60000")
    assert in_a_day(expiries(redis)) == 0


def test_a_24h_prompt_lives_24_hours_in_redis_and_outlives_its_replica(
    redis: RedisServer, tmp_path: Path
) -> None:
    args = [*TINY, *redis.serve_flags(), *REMOTE]
    first = ServerProcess([*args, "--disk-cache-dir", str(tmp_path / "kv1")], tmp_path / "1.log")
    try:
        text, usage = ask(first, "24h")
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # computed here
        reusable = (usage["prompt_tokens"] - 1) // PAGE_SIZE * PAGE_SIZE  # whole pages
        pages = reusable // PAGE_SIZE
        assert pages >= 10
        found = once(redis, lambda found: in_a_day(found) >= pages)
        assert in_a_day(found) == pages, found
        note = complete(first, "An ordinary note. " + document(5, 180))  # the default retention
        note_pages = full_pages(note) // PAGE_SIZE
        found = once(redis, lambda found: found.count(-1) >= note_pages)
        assert found.count(-1) >= note_pages and in_a_day(found) == pages, found
        assert retained_in_remote(first, pages) == pages
        age(redis)
        ask(first, "24h")  # sent again: its 24 hours start again
        assert in_a_day(once(redis, lambda found: in_a_day(found) >= pages)) == pages
        flood(first, 6, seed=40)  # more pages than the device, host and disk tiers hold
        assert in_a_day(expiries(redis)) == pages  # the flood's pages carry no expiry
    finally:
        first.stop()
    second = ServerProcess([*args, "--disk-cache-dir", str(tmp_path / "kv2")], tmp_path / "2.log")
    try:
        again, usage = ask(second, "24h")
        by_tier = usage["prompt_tokens_details"]["cached_tokens_by_tier"]
        assert by_tier["remote"] == reusable, usage
        assert again == text  # fp32, greedy: the same tokens as computed from scratch
        age(redis)
        ask(second, "24h")  # retained anew on this replica: the same pages' 24 hours again
        assert in_a_day(once(redis, lambda found: in_a_day(found) >= pages)) == pages
    finally:
        second.stop()

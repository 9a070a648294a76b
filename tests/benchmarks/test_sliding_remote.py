"""benchmarks/sliding_remote.py on a small workload against a real Redis: with a sliding-window
model's pages kept as parts, Redis holds every page's full part and the sliding part of the last
window (and margin) of each chat only, in fewer bytes than whole pages, and a second replica
reuses every whole page of each chat's history either way; the result renders."""

import argparse
from pathlib import Path

import pytest

from benchmarks.redis_server import RedisServer
from benchmarks.sliding_history import Workload
from benchmarks.sliding_remote import render_markdown, replay
from tests.redis_servers import require_redis
from tieredkv.bench.result_file import load_results, write_result
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES

ARGS = argparse.Namespace(device_pages=512, seed=0)
CHATS = Workload("long", 2, 4, 256, 128)  # 1,536 tokens a chat: turns shorter than the window
WINDOW, PAGE_SIZE = 512, 16


@pytest.fixture
def redis(tmp_path: Path):
    require_redis()
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_parts_keep_the_last_window_of_each_chat_and_reuse_every_page(
    redis: RedisServer, tmp_path: Path
) -> None:
    whole = replay(redis, False, CHATS, 0, ARGS)
    parts = replay(redis, True, CHATS, 0, ARGS)
    pages = CHATS.chats * CHATS.turns * (CHATS.user_tokens + CHATS.answer_tokens) // PAGE_SIZE
    assert whole["values"] == pages and whole["dropped_writes"] == parts["dropped_writes"] == 0
    # every turn's end was a reuse point when written; the turns since took the earlier back
    window_pages = -(-(WINDOW - 1 + REUSE_MARGIN_PAGES * PAGE_SIZE) // PAGE_SIZE)
    assert parts["values"] == pages + CHATS.chats * window_pages
    assert parts["remote_sliding_parts_written"] == CHATS.chats * window_pages
    assert parts["value_bytes"] < whole["value_bytes"] / 2
    assert whole["reused_tokens"] == parts["reused_tokens"] == parts["reusable_tokens"] > 0
    assert whole["integrity_ok"] and parts["integrity_ok"]
    write_result(
        tmp_path / "sliding_remote" / "x", "sliding_remote",
        settings={**vars(ARGS), "caps": "", "page_size": 16, "prefill_chunk": 512},
        summary={"full_layers": 4, "sliding_layers": 22, "window": 512, "page_bytes": 26624},
        records=[whole, parts],
    )  # fmt: skip
    (result,) = load_results(tmp_path)["sliding_remote"]
    page = render_markdown([result])
    assert "| 2 (long), parts | 1,536 | 260 | 2.2 MiB |" in page

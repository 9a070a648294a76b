"""How many bytes a sliding-window model's chat history takes in the remote tier, and what a
second replica reuses of it: pages kept as parts (the full layers of every page, the sliding
layers only where the rule keeps them) against whole pages (every layer of every page, what the
remote tier stores for a model without sliding layers).

The caches under test are the real ones (`build_cache` with a remote tier on a real
`redis-server`: write-through to Redis at insert, the writes a running sequence holds back
until its lock goes, the look-up of a second replica with the cut where a window would read a
missing sliding part; the device tier keeps whole pages, so the remote tier is measured
alone); no model runs, since what Redis holds and what a match reuses depend on pages and the
tree, not on the values in them. The model is Gemma 3 1B's layer shape
(`sliding_history.gemma3_1b_shape`). "Whole pages" is the same layout built without the model's
layer kinds, so its remote tier keeps whole pages and no rule applies.

Workload: chats interleaved turn by turn on a first replica (each turn inserted a prefill chunk
at a time, then with its answer, under a lock that moves down as the engine's does; its writes
to Redis finish before the next turn, as a model's compute time would let them); then a second
replica, which never saw them, takes each chat's next turn: what it reuses from Redis.
Each mode runs on an empty Redis without a memory limit (the bytes it holds), then with
`maxmemory` set to a share of the whole-page bytes (`allkeys-lru`: what the same memory keeps).
The limit a turn is judged by is the cache's own arithmetic, outside the code under test: its
history in whole pages (`reusable`).

    .venv/bin/python -m benchmarks.sliding_remote [--caps 0.5]
"""

from __future__ import annotations

import argparse
import datetime
import random
import tempfile
from pathlib import Path

import redis as redis_py
import torch

from benchmarks.redis_server import RedisServer
from benchmarks.sliding_history import (
    CHUNK,
    PAGE_SIZE,
    Workload,
    gemma3_1b_shape,
    run_request,
)
from tieredkv.bench.result_file import machine_line, write_result
from tieredkv.cache.build import build_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.sliding_pages import LayerKinds
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.model_config import ModelConfig

REPO = Path(__file__).resolve().parent.parent
FLUSH_S = 120.0
# counts, not timings: a look-up that runs past its budget on a busy machine would turn the
# store degraded and count as no reuse, so the budgets are generous (as the serve tests' are)
BUDGET_SCALE = 20.0
WORKLOADS = (Workload("long", 16, 8, 256, 128), Workload("short", 64, 4, 64, 32))


def _replica(redis: RedisServer, model: ModelConfig | None, args: argparse.Namespace):
    layout = PageLayout.for_model(gemma3_1b_shape(), PAGE_SIZE, torch.float32)
    config = CacheConfig(
        page_size=PAGE_SIZE,
        device_cache_bytes=args.device_pages * layout.page_bytes,
        host_cache_bytes=0,
        write_policy=WritePolicy.WRITE_THROUGH,
        remote_cache_url=redis.url,
        remote_budget_scale=BUDGET_SCALE,
        device_whole_pages=True,  # the remote tier measured alone
    )
    cache = build_cache(config, layout, b"sliding-remote", "cpu", model=model)
    assert cache.pools.remote is not None and cache.pools.remote.store.wait_healthy(10.0)
    return cache


def _stored(redis: RedisServer) -> tuple[int, int]:
    """(values, bytes of values) of tieredkv's pages in Redis."""
    client = redis_py.Redis.from_url(redis.url)
    names = list(client.scan_iter(match=KEY_PREFIX + "*", count=1000))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    return len(names), sum(pipe.execute())


def replay(
    redis: RedisServer, parts: bool, workload: Workload, cap: int, args: argparse.Namespace
) -> dict:
    """`workload` on a first replica, then each chat's next turn on a second one."""
    client = redis_py.Redis.from_url(redis.url)
    client.flushall()
    client.config_set("maxmemory", cap)
    client.config_set("maxmemory-policy", "allkeys-lru")
    model = gemma3_1b_shape() if parts else None
    first = _replica(redis, model, args)
    assert first.pools.remote is not None
    store = first.pools.remote.store
    rng = random.Random(args.seed)
    histories: list[list[int]] = [[] for _ in range(workload.chats)]
    for _ in range(workload.turns):
        for chat, history in enumerate(histories):
            prompt = [*history, *(rng.randrange(1, 256) for _ in range(workload.user_tokens))]
            sequence = [*prompt, *(rng.randrange(1, 256) for _ in range(workload.answer_tokens))]
            run_request(first, prompt, sequence)
            assert store.flush_writes(FLUSH_S)  # a turn's compute time lets its writes finish
            histories[chat] = sequence
    values, value_bytes = _stored(redis)
    dropped = store.counters().dropped_writes
    used_memory = int(client.info("memory")["used_memory"])
    written_pages, sliding_pages = first.tier_parts_held(Tier.REMOTE)
    first.close()
    second = _replica(redis, model, args)
    reused = reusable = 0
    for history in histories:
        prompt = [*history, *(rng.randrange(1, 256) for _ in range(workload.user_tokens))]
        second.look_up_remote(prompt)
        reused += second.match(prompt).matched_len
        reusable += len(history) - len(history) % PAGE_SIZE
    integrity = second.check_integrity()
    assert second.pools.remote is not None
    failed_calls = second.pools.remote.store.counters().errors
    second.close()
    return {
        **workload._asdict(),
        "parts": parts,
        "maxmemory": cap,
        "values": values,
        "dropped_writes": dropped,
        "value_bytes": value_bytes,
        "used_memory": used_memory,
        "remote_pages_written": written_pages,
        "remote_sliding_parts_written": sliding_pages,
        "reused_tokens": reused,
        "reusable_tokens": reusable,
        "reuse_of_reusable": reused / reusable if reusable else 0.0,
        "second_replica_failed_calls": failed_calls,
        "integrity_ok": integrity.ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device-pages", type=int, default=512)
    parser.add_argument("--caps", default="0.5", help="maxmemory, shares of whole-page bytes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = gemma3_1b_shape()
    layout = PageLayout.for_model(model, PAGE_SIZE, torch.float32)
    kinds = LayerKinds.of(model, layout)
    records = []
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory)).start()
        try:
            for workload in WORKLOADS:
                whole = replay(redis, False, workload, 0, args)
                runs = [whole, replay(redis, True, workload, 0, args)]
                for share in (float(text) for text in args.caps.split(",")):
                    cap = int(whole["used_memory"] * share)
                    runs += [replay(redis, parts, workload, cap, args) for parts in (False, True)]
                for record in runs:
                    print(record, flush=True)
                records += runs
        finally:
            redis.stop()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M")
    out = args.out or REPO / "benchmarks" / "results" / "sliding_remote" / stamp
    summary = {
        "full_layers": kinds.full_layers,
        "sliding_layers": kinds.sliding_layers,
        "window": kinds.window,
        "page_bytes": layout.page_bytes,
    }
    settings = {key: value for key, value in vars(args).items() if key != "out"}
    settings |= {"page_size": PAGE_SIZE, "prefill_chunk": CHUNK}
    write_result(out, "sliding_remote", settings=settings, summary=summary, records=records)
    print(f"wrote {out}")
    return 0


def render_markdown(results: list[dict]) -> str:
    """The latest result: per workload, mode and memory limit, what Redis holds and what a
    second replica reused of what it could."""
    result = results[-1]
    summary, settings = result["summary"], result["settings"]
    lines = [
        "## Sliding-window layers: history the remote tier holds",
        "",
        f"`{result['dir']}`, {machine_line(result)}; `python -m benchmarks.sliding_remote` "
        "(the caches and a real Redis, no model runs: counts and bytes, not timings).",
        "",
        f"Gemma 3 1B's layer shape ({summary['full_layers']} full-attention layers, "
        f"{summary['sliding_layers']} sliding with a {summary['window']}-token window), page "
        f"{settings['page_size']}; a first replica runs the chats interleaved turn by turn, "
        f"inserted a {settings['prefill_chunk']}-token prefill chunk at a time; a second replica "
        "then takes each chat's next turn. Whole pages: every layer of every page in Redis (the "
        "remote tier without layer kinds). The limit: a turn reuses at most its history in "
        "whole pages (reusable).",
        "",
        "| chats | tokens a chat | Redis values | value bytes | Redis used_memory | "
        "Redis maxmemory | second replica reused / reusable |",
        "|---|---|---|---|---|---|---|",
    ]
    for record in result["records"]:
        chat_tokens = record["turns"] * (record["user_tokens"] + record["answer_tokens"])
        mode = "parts" if record["parts"] else "whole pages"
        cap = f"{record['maxmemory'] / 2**20:.1f} MiB" if record["maxmemory"] else "none"
        lines.append(
            f"| {record['chats']} ({record['name']}), {mode} | {chat_tokens:,} | "
            f"{record['values']:,} | {record['value_bytes'] / 2**20:.1f} MiB | "
            f"{record['used_memory'] / 2**20:.1f} MiB | {cap} | "
            f"{record['reuse_of_reusable']:.1%} ({record['reused_tokens']:,} / "
            f"{record['reusable_tokens']:,}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

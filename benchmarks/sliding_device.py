"""How much chat history the device tier holds for a sliding-window model, and what a next turn
reuses from it: the same device bytes as whole pages (`--device-whole-pages`) and split (the
default: every page allocated whole, its sliding layers freed once neither the running
sequence's window nor a next turn's reads them).

The cache under test is the real one (`build_cache` with a device tier only: the split device
pool, the parts a running sequence's window has passed freed after each insert
(`TieredCache.window_passed`, as the engine's requests call it), those no reuse point reads
freed when the path's last lock goes, eviction, the match cut where a window would read a
missing sliding part); no model runs, since what a tier holds and what a match reuses depend on
pages and the tree. The model and workloads are `sliding_history`'s: Gemma 3 1B's layer shape,
chats interleaved turn by turn. Each request goes through a `CacheHandle`, as the engine's do:
its page table starts with the tree's device pages of its match (locked), it reserves pages a
prefill chunk at a time and inserts them, then its answer, and releases. The limit a turn is
judged by is the cache's own arithmetic, outside the code under test: its history in whole
pages (`reusable`).

    .venv/bin/python -m benchmarks.sliding_device
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from benchmarks.sliding_history import (
    CHUNK,
    PAGE_SIZE,
    Workload,
    reuse_cell,
    run_and_write,
    settle,
    workload_cells,
)
from tieredkv.bench.result_file import machine_line
from tieredkv.cache.build import build_cache
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig
from tieredkv.model_config import ModelConfig

REPO = Path(__file__).resolve().parent.parent


def run_request(cache: TieredCache, prompt: list[int], sequence: list[int]) -> int:
    """A request through a `CacheHandle`: its match's device pages start its page table, then
    it computes the rest of `prompt` a prefill chunk at a time and its answer (`sequence`),
    reserving and inserting as the engine does, and releases its pages. Returns what its page
    table took of the device at its end, in whole pages."""
    handle = CacheHandle(cache, "default")
    while not handle.promote(prompt):
        settle(cache)  # demotions started for room
    while handle.promotion_pending:
        settle(cache)
    promoted = handle.take_promotion()
    start = 0 if promoted is None else promoted.num_tokens
    for end in [*range(start + CHUNK, len(prompt), CHUNK), len(prompt), len(sequence)]:
        while not handle.reserve(end):
            settle(cache)
        handle.insert(sequence[:end])
        settle(cache)
    held = cache.device_pages_held(handle.page_table)
    handle.release()
    settle(cache)
    return held


def replay(model: ModelConfig, split: bool, workload: Workload, args: argparse.Namespace) -> dict:
    """`workload` on a fresh cache of one device tier of `args.device_pages` whole pages'
    bytes."""
    layout = PageLayout.for_model(model, PAGE_SIZE, torch.float32)
    config = CacheConfig(
        page_size=PAGE_SIZE,
        device_cache_bytes=args.device_pages * layout.page_bytes,
        host_cache_bytes=0,
        device_whole_pages=not split,
    )
    cache = build_cache(config, layout, b"sliding-device", "cpu", model=model)
    rng = random.Random(args.seed)
    histories: list[list[int]] = [[] for _ in range(workload.chats)]
    reused = reusable = running_peak = 0
    for turn in range(workload.turns):
        for chat, history in enumerate(histories):
            prompt = [*history, *(rng.randrange(1, 256) for _ in range(workload.user_tokens))]
            if turn > 0:
                reused += cache.match(prompt).matched_len
                reusable += len(history) - len(history) % PAGE_SIZE
            sequence = [*prompt, *(rng.randrange(1, 256) for _ in range(workload.answer_tokens))]
            running_peak = max(running_peak, run_request(cache, prompt, sequence))
            histories[chat] = sequence
    settle(cache)
    integrity = cache.check_integrity()
    pages, sliding = cache.tier_parts_held(Tier.DEVICE)
    record = {
        **workload._asdict(),
        "split": split,
        "device_capacity_bytes": cache.tier_capacity_bytes(Tier.DEVICE),
        "device_full_tokens": pages * PAGE_SIZE,
        "device_sliding_tokens": sliding * PAGE_SIZE,
        "reused_tokens": reused,
        "reusable_tokens": reusable,
        "reuse_of_reusable": reused / reusable if reusable else 0.0,
        "running_peak_pages": running_peak,
        "longest_sequence_pages": len(max(histories, key=len)) // PAGE_SIZE,
        "integrity_ok": integrity.ok,
    }
    cache.close()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device-pages", type=int, default=2304, help="whole pages' bytes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_and_write("sliding_device", replay, args, {"device_whole_tokens": args.device_pages})
    return 0


def render_markdown(results: list[dict]) -> str:
    """The latest result: per workload, whole or split, what the device holds and what the next
    turns reused of what they could."""
    result = results[-1]
    summary = result["summary"]
    lines = [
        "## Sliding-window layers: history the device tier holds",
        "",
        f"`{result['dir']}`, {machine_line(result)}; `python -m benchmarks.sliding_device` "
        "(the cache alone, no model runs: counts, not timings).",
        "",
        f"`sliding_history`'s model shape ({summary['full_layers']} full-attention layers, "
        f"{summary['sliding_layers']} sliding with a {summary['window']}-token window), "
        f"chats and requests; one device tier of the bytes of "
        f"{summary['device_whole_tokens']:,} tokens of whole pages, no tier below. The limit: "
        "a turn reuses at most its history in whole pages (reusable). A running chat's pages: "
        "the most a request's page table took of the device at its end, in whole pages, "
        "against its sequence's pages.",
        "",
        "| chats | tokens a chat | history, all chats | device pages | device tokens, "
        "full layers | device tokens, sliding layers | reused / reusable, turns 2+ | "
        "a running chat's pages |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for record in result["records"]:
        lines.append(
            f"{workload_cells(record)}{record['device_full_tokens']:,} | "
            f"{record['device_sliding_tokens']:,} | {reuse_cell(record)} | "
            f"{record['running_peak_pages']:,} of {record['longest_sequence_pages']:,} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

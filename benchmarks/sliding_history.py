"""How much chat history the host tier holds for a sliding-window model, and what a next turn
reuses from it: the same host bytes as whole pages (`--host-whole-pages`) and split (the
default: full-attention layers for every page, sliding layers where a next turn reads them).

The cache under test is the real one (`build_cache`: device and host pools, write-through,
demotion, the split host pool's sliding arena, its reclaim and eviction, the match cut where a
window would read a missing sliding part; the device tier keeps whole pages, so the host is
measured alone, and `sliding_device` measures the device); no model runs, since what a tier
holds and what a match reuses depend on pages and the tree, not on the values in them. The
model is Gemma 3 1B's layer shape (26 layers, a global one every sixth, 512-token windows) with
small heads, so the host tier is a few MiB; the bytes scale with the heads, the ratios do not.

Workload: chats interleaved turn by turn (every chat's turn 1, then every chat's turn 2, ...),
each turn a user message and an answer; a turn's request inserts its prompt a prefill chunk at a
time, then its whole sequence with the answer (as the engine does, so the tree holds a node per
chunk). Before each turn its prompt is matched: the tokens it would reuse, and from which tier.
The rule the figures are judged by is the cache's own arithmetic, outside the code under test:
a turn can reuse at most its history in whole pages (`reusable`).

    .venv/bin/python -m benchmarks.sliding_history
"""

from __future__ import annotations

import argparse
import datetime
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from tieredkv.bench.result_file import machine_line, write_result
from tieredkv.cache.build import build_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.sliding_pages import LayerKinds
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.model_config import ModelConfig

REPO = Path(__file__).resolve().parent.parent
PAGE_SIZE = 16
CHUNK = 512  # the engine's prefill chunk: one insert (one node) per chunk


class Workload(NamedTuple):
    name: str
    chats: int
    turns: int
    user_tokens: int
    answer_tokens: int

    @property
    def history_tokens(self) -> int:
        return self.chats * self.turns * (self.user_tokens + self.answer_tokens)


# long chats (3,072 tokens, six windows) and short ones (384 tokens, within one window), each
# at several working sets against the host tier's 36,864 tokens of whole pages
WORKLOADS = (
    Workload("long", 16, 8, 256, 128),
    Workload("long", 32, 8, 256, 128),
    Workload("long", 48, 8, 256, 128),
    Workload("short", 128, 4, 64, 32),
    Workload("short", 256, 4, 64, 32),
)


def gemma3_1b_shape(window: int = 512, head_dim: int = 8) -> ModelConfig:
    """Gemma 3 1B's layers (26, every sixth global, the rest sliding) with small heads."""
    windows = tuple(None if (layer + 1) % 6 == 0 else window for layer in range(26))
    return ModelConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_layers=26, num_heads=1,
        num_kv_heads=1, head_dim=head_dim, layer_windows=windows, architecture="gemma3",
    )  # fmt: skip


def settle(cache: TieredCache) -> None:
    """Apply every transfer in flight."""
    cache.poll()
    while cache.transfer_queue.in_flight:
        time.sleep(0.001)
        cache.poll()


def run_request(cache: TieredCache, prompt: list[int], sequence: list[int]) -> None:
    """A request that computes `sequence` (its prompt, then its answer) and inserts its full
    pages a prefill chunk at a time, then with the answer, holding a lock on its deepest node
    as the engine's requests do. Its page table starts with the tree's device pages for what
    the tree held (the pages it computed for those go back) and grows by new pages only."""
    locked, table = None, []
    for end in [*range(CHUNK, len(prompt), CHUNK), len(prompt), len(sequence)]:
        while (new := cache.allocate(end // PAGE_SIZE - len(table))) is None:
            settle(cache)
        result = cache.insert(sequence[:end], "default", [*table, *new])
        table = list(result.device_pages[: result.num_pages])
        taken = set(table)
        cache.free([page for page in new if page not in taken])
        if result.node is not None and result.node is not locked:
            cache.lock(result.node)
            if locked is not None:
                cache.unlock(locked)
            locked = result.node
        settle(cache)
    if locked is not None:
        cache.unlock(locked)
    settle(cache)


def replay_chats(cache: TieredCache, workload: Workload, seed: int, tier: Tier) -> dict:
    """`workload`'s chats interleaved turn by turn through `run_request`, each prompt matched
    first; what turns 2+ reused of what they could, and how much of it from `tier`."""
    rng = random.Random(seed)
    histories: list[list[int]] = [[] for _ in range(workload.chats)]
    reused = reusable = from_tier = 0
    for turn in range(workload.turns):
        for chat, history in enumerate(histories):
            prompt = [*history, *(rng.randrange(1, 256) for _ in range(workload.user_tokens))]
            match = cache.match(prompt)
            if turn > 0:
                reused += match.matched_len
                reusable += len(history) - len(history) % PAGE_SIZE
                from_tier += match.tokens_by_tier()[tier]
            sequence = [*prompt, *(rng.randrange(1, 256) for _ in range(workload.answer_tokens))]
            run_request(cache, prompt, sequence)
            histories[chat] = sequence
    settle(cache)
    return {
        "reused_tokens": reused,
        "reusable_tokens": reusable,
        "reused_from_tier_tokens": from_tier,
        "reuse_of_reusable": reused / reusable if reusable else 0.0,
    }


def replay(model: ModelConfig, split: bool, workload: Workload, args: argparse.Namespace) -> dict:
    """`workload` on a fresh cache whose host tier has `args.host_pages` whole pages' bytes."""
    layout = PageLayout.for_model(model, PAGE_SIZE, torch.float32)
    config = CacheConfig(
        page_size=PAGE_SIZE,
        device_cache_bytes=args.device_pages * layout.page_bytes,
        host_cache_bytes=args.host_pages * layout.page_bytes,
        write_policy=WritePolicy.WRITE_THROUGH,
        host_whole_pages=not split,
        device_whole_pages=True,  # the host measured alone (`sliding_device`: the device)
    )
    cache = build_cache(config, layout, b"sliding-history", "cpu", model=model)
    reuse = replay_chats(cache, workload, args.seed, Tier.HOST)
    integrity = cache.check_integrity()
    pages, sliding = cache.tier_parts_held(Tier.HOST)
    record = {
        **workload._asdict(),
        "split": split,
        "host_capacity_bytes": cache.tier_capacity_bytes(Tier.HOST),
        "host_pages": cache.tier_num_pages(Tier.HOST),
        "host_full_tokens": pages * PAGE_SIZE,
        "host_sliding_tokens": sliding * PAGE_SIZE,
        "reused_tokens": reuse["reused_tokens"],
        "reusable_tokens": reuse["reusable_tokens"],
        "reused_from_host_tokens": reuse["reused_from_tier_tokens"],
        "reuse_of_reusable": reuse["reuse_of_reusable"],
        "integrity_ok": integrity.ok,
    }
    cache.close()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device-pages", type=int, default=512)
    parser.add_argument("--host-pages", type=int, default=2304, help="whole pages' bytes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run_and_write("sliding_history", replay, args, {"host_whole_tokens": args.host_pages})
    return 0


Replay = Callable[[ModelConfig, bool, Workload, argparse.Namespace], dict]


def run_and_write(
    name: str,
    replay: Replay,
    args: argparse.Namespace,
    whole: dict,
    model: ModelConfig | None = None,
) -> Path:
    """Every workload with whole pages, then split, through `replay` on `model` (by default
    `gemma3_1b_shape()`); the result is written under `benchmarks/results/<name>` (or
    `args.out`), its summary the model's layer kinds and `whole` (a key each: whole pages,
    turned into tokens)."""
    model = model or gemma3_1b_shape()
    kinds = LayerKinds.of(model, PageLayout.for_model(model, PAGE_SIZE, torch.float32))
    records = []
    for workload in WORKLOADS:
        for split in (False, True):
            record = replay(model, split, workload, args)
            print(record, flush=True)
            records.append(record)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M")
    out = args.out or REPO / "benchmarks" / "results" / name / stamp
    summary = {
        "full_layers": kinds.full_layers,
        "sliding_layers": kinds.sliding_layers,
        "window": kinds.window,
        **{key: pages * PAGE_SIZE for key, pages in whole.items()},
    }
    settings = {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key != "out"
    }
    settings |= {"page_size": PAGE_SIZE, "prefill_chunk": CHUNK}
    write_result(out, name, settings=settings, summary=summary, records=records)
    print(f"wrote {out}")
    return out


def workload_cells(record: dict, split_name: str = "split") -> str:
    """A result row's first cells (this module's, `sliding_device`'s and `sliding_disk`'s): the
    chats, a chat's tokens, all chats' history, whole or `split_name`."""
    chat_tokens = record["turns"] * (record["user_tokens"] + record["answer_tokens"])
    kind = split_name if record["split"] else "whole"
    return (
        f"| {record['chats']} ({record['name']}) | {chat_tokens:,} | "
        f"{record['chats'] * chat_tokens:,} | {kind} | "
    )


def reuse_cell(record: dict) -> str:
    """What turns 2+ reused of what they could: share (reused / reusable)."""
    return (
        f"{record['reuse_of_reusable']:.1%} ({record['reused_tokens']:,} / "
        f"{record['reusable_tokens']:,})"
    )


def render_markdown(results: list[dict]) -> str:
    """The latest result: per workload, whole or split, what the host holds and what the next turns
    reused of what they could."""
    result = results[-1]
    summary, settings = result["summary"], result["settings"]
    lines = [
        "## Sliding-window layers: history the host tier holds",
        "",
        f"`{result['dir']}`, {machine_line(result)}; `python -m benchmarks.sliding_history` "
        "(the cache alone, no model runs: counts, not timings).",
        "",
        f"Gemma 3 1B's layer shape ({summary['full_layers']} full-attention layers, "
        f"{summary['sliding_layers']} sliding with a {summary['window']}-token window), page "
        f"{settings['page_size']}; chats interleaved turn by turn, each turn a user message and "
        f"an answer, inserted a {settings['prefill_chunk']}-token prefill chunk at a time; "
        f"device tier {settings['device_pages']} pages, host tier the bytes of "
        f"{summary['host_whole_tokens']:,} tokens of whole pages; write-through. The limit: a "
        "turn reuses at most its history in whole pages (reusable).",
        "",
        "| chats | tokens a chat | history, all chats | host pages | host tokens, "
        "full layers | host tokens, sliding layers | reused / reusable, turns 2+ |",
        "|---|---|---|---|---|---|---|",
    ]
    for record in result["records"]:
        lines.append(
            f"{workload_cells(record)}{record['host_full_tokens']:,} | "
            f"{record['host_sliding_tokens']:,} | {reuse_cell(record)} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

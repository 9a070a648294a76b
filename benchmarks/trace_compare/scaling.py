"""Whole conversations from Mooncake's conversation trace, scaled to a 2-core CPU.

A line of the trace is one request: `timestamp` (ms), `input_length`, `output_length` and
`hash_ids`, one id per 512-token block, equal ids meaning equal prefixes. A conversation is a
chain of requests each of whose blocks (past the first, which every request shares) extend an
earlier request's. The selection keeps every `every`-th conversation, in order of its first
turn, among those whose first turn falls in the trace's first `start_window_s` seconds (so
each has the rest of the trace for its later turns), and keeps all of its turns.

Scaling: lengths are divided by `TRACE_BLOCK_TOKENS / tokens_per_block` (512 / 16 = 32) and
rounded up, so one hash id stays one block of the client's prompt; outputs are divided by
`output_divisor` (at least 1, at most `output_cap`). Timestamps stay the trace's own, shifted
to start at 0: the replay compresses time with the client's `--timed-trace-sec-multiplier`.

    .venv/bin/python -m benchmarks.trace_compare.scaling SOURCE.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

TRACE_BLOCK_TOKENS = 512
TRACES = Path(__file__).resolve().parent.parent / "traces"
SCALED_TRACE = TRACES / "mooncake_conversations.jsonl"
SCALED_META = TRACES / "mooncake_conversations.meta.json"


@dataclass(frozen=True)
class ScalingConfig:
    tokens_per_block: int = 16  # the client's tokens per hash id (tieredkv's page size)
    output_divisor: int = 16
    output_cap: int = 128
    start_window_s: float = 1800.0  # first turns in the first half of the hour-long trace
    every: int = 36  # every 36th such conversation: ~170 requests, ~72 s at 48x

    def __post_init__(self) -> None:
        if TRACE_BLOCK_TOKENS % self.tokens_per_block:
            raise ValueError(f"tokens_per_block must divide 512, got {self.tokens_per_block}")
        if self.every < 1 or self.output_divisor < 1 or self.output_cap < 1:
            raise ValueError(f"every, output_divisor, output_cap must be >= 1: {self}")

    @property
    def input_divisor(self) -> int:
        return TRACE_BLOCK_TOKENS // self.tokens_per_block


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def conversation_ids(rows: list[dict]) -> list[int]:
    """Each request's conversation: that of the earlier request sharing its longest prefix of
    two or more blocks, else a new one (numbered in order of first turn)."""
    owner: dict[tuple[int, ...], int] = {}  # a prefix of >= 2 blocks -> its latest request
    ids: list[int] = []
    next_id = 0
    for index, row in enumerate(rows):
        blocks = tuple(row["hash_ids"])
        parent = next(
            (owner[blocks[:n]] for n in range(len(blocks), 1, -1) if blocks[:n] in owner), None
        )
        if parent is None:
            ids.append(next_id)
            next_id += 1
        else:
            ids.append(ids[parent])
        for n in range(2, len(blocks) + 1):
            owner[blocks[:n]] = index
    return ids


def select(rows: list[dict], config: ScalingConfig) -> list[dict]:
    """The requests of the selected conversations, in trace order."""
    ids = conversation_ids(rows)
    first_ms: dict[int, float] = {}
    for row, conversation in zip(rows, ids, strict=True):
        first_ms.setdefault(conversation, row["timestamp"])
    early = [c for c, ms in first_ms.items() if ms < config.start_window_s * 1000]
    chosen = set(early[:: config.every])
    return [row for row, conversation in zip(rows, ids, strict=True) if conversation in chosen]


def scale(rows: list[dict], config: ScalingConfig) -> list[dict]:
    """Lengths scaled, timestamps shifted to start at 0 ms."""
    start_ms = rows[0]["timestamp"] if rows else 0
    out_tokens = [max(1, row["output_length"] // config.output_divisor) for row in rows]
    return [
        {
            "timestamp": row["timestamp"] - start_ms,
            "input_length": math.ceil(row["input_length"] / config.input_divisor),
            "output_length": min(config.output_cap, num_out),
            "hash_ids": row["hash_ids"],
        }
        for row, num_out in zip(rows, out_tokens, strict=True)
    ]


def prompt_blocks(row: dict, tokens_per_block: int) -> list[tuple[int, int]]:
    """The (hash id, tokens) chunks the client expands the row into; a short last chunk has
    tokens of its own (the client seeds it with the id and its size)."""
    chunks = []
    left = row["input_length"]
    for block in row["hash_ids"]:
        size = min(tokens_per_block, left)
        chunks.append((block, size))
        left -= size
        if left <= 0:
            break
    return chunks


def trace_max_hit_tokens(rows: list[dict], tokens_per_block: int, page_size: int) -> list[int]:
    """Per request, the most prompt tokens a cache of unbounded size could reuse: the longest
    run of whole pages that an earlier prompt began with, at most prompt length - 1 (the last
    token is always computed). Needs page_size to be a multiple of tokens_per_block."""
    if page_size % tokens_per_block:
        raise ValueError(f"page_size {page_size} is not a multiple of {tokens_per_block}")
    seen: set[tuple[tuple[int, int], ...]] = set()  # every earlier prompt's whole-page prefixes
    hits = []
    per_page = page_size // tokens_per_block
    for row in rows:
        chunks = prompt_blocks(row, tokens_per_block)
        num_tokens = sum(size for _, size in chunks)
        prefixes = [tuple(chunks[: n * per_page]) for n in range(1, len(chunks) // per_page + 1)]
        prefixes = [p for p in prefixes if sum(size for _, size in p) == len(p) * tokens_per_block]
        matched = 0
        for prefix in prefixes:
            if prefix not in seen:
                break
            matched = len(prefix) * tokens_per_block
        hits.append(min(matched, max(0, num_tokens - 1)))
        seen.update(prefixes)
    return hits


def write_scaled(source: Path, config: ScalingConfig, page_size: int) -> dict:
    """Write SCALED_TRACE and SCALED_META (source sha256, rule, counts); return the meta."""
    rows = scale(select(read_trace(source), config), config)
    hits = trace_max_hit_tokens(rows, config.tokens_per_block, page_size)
    prompt_tokens = sum(row["input_length"] for row in rows)
    meta = {
        "source": "github.com/kvcache-ai/Mooncake FAST25-release/traces/" + source.name,
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "scaling": asdict(config),
        "requests": len(rows),
        "span_s": rows[-1]["timestamp"] / 1000 if rows else 0.0,
        "prompt_tokens": prompt_tokens,
        "output_tokens": sum(row["output_length"] for row in rows),
        "page_size": page_size,
        "trace_max_hit_tokens": sum(hits),
    }
    TRACES.mkdir(parents=True, exist_ok=True)
    SCALED_TRACE.write_text("".join(json.dumps(row) + "\n" for row in rows))
    SCALED_META.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="conversation_trace.jsonl")
    parser.add_argument("--page-size", type=int, default=16, help="tieredkv's page size")
    args = parser.parse_args(argv)
    meta = write_scaled(args.source, ScalingConfig(), args.page_size)
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

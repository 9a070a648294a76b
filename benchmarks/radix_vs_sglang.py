"""tieredkv's tree against SGLang's RadixCache on one chat trace, replayed in the same process.

    benchmarks/sglang_radix.sh install        # once: SGLang in .venv-sglang
    benchmarks/sglang_radix.sh run [--runs 5] [--out DIR]
    .venv/bin/python -m benchmarks.radix_vs_sglang --no-sglang   # tieredkv alone

The trace (benchmarks/radix/replay_trace.py): 64 users x 8 rounds of a multi-turn chat,
prompts of 2.5k-3.4k tokens, page size 16; 8,192 device pages (60% of the final working set),
so most requests evict (LRU keeps the histories of users who come back soon). tieredkv is
driven through the engine's own `RequestPages` (radix/tieredkv_replay.py), SGLang's
`RadixCache` as its scheduler drives it (radix/sglang_replay.py); both see the same inserts.
Timed on both: match, insert, evict.

Both replays alternate request by request (who goes first alternates too), so machine noise
hits both alike. Each run replays the whole trace on fresh caches after a warm-up of one round
of another trace, and times one memcmp of a median-length prompt's packed bytes (the least a
whole-prompt match can cost) as the limit beside the match figures. The raw samples go to
`DIR/result.json` (default `benchmarks/results/radix_vs_sglang/<UTC date-time>/`), rendered
into docs/benchmarks.md by `make bench-report` (radix/vs_sglang_report.py). Without SGLang the
result has no SGLang records and the report says it was not measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import torch

from benchmarks.radix.radix_limits import memcmp_floor_samples_ns
from benchmarks.radix.replay_trace import CHUNK_TOKENS, PAGE_SIZE, Turn, make_trace
from benchmarks.radix.sglang_replay import SglangMissingError, SglangReplay, load_sglang
from benchmarks.radix.tieredkv_replay import TieredkvReplay
from benchmarks.radix.vs_sglang_report import LIMIT, render_markdown, run_record, summarise
from tieredkv.bench.result_file import write_result

__all__ = ["main", "render_markdown", "replay"]

BENCHMARK = "radix_vs_sglang"
RESULTS_DIR = Path(__file__).resolve().parent / "results" / BENCHMARK
LIMIT_REPEATS = 200


def replay(trace: list[Turn], num_pages: int, sg: types.SimpleNamespace | None) -> dict[str, Any]:
    """Both trees (tieredkv alone if `sg` is None) through the whole trace, request by request."""
    systems: dict[str, Any] = {"tieredkv": TieredkvReplay(num_pages)}
    if sg is not None:
        systems["sglang"] = SglangReplay(sg, num_pages)
    names = list(systems)
    for seq_id, turn in enumerate(trace):
        for name in names if seq_id % 2 == 0 else reversed(names):
            systems[name].run(turn, seq_id)
    systems["tieredkv"].check()
    return systems


def measure(
    trace: list[Turn], args: argparse.Namespace, sg: types.SimpleNamespace | None
) -> list[dict[str, Any]]:
    """Every run's records: each tree's samples and counters, and the memcmp limit."""
    prompt_tokens = sum(len(turn.prompt) for turn in trace)
    limit_len = int(statistics.median(len(turn.prompt) for turn in trace))
    replay(make_trace(args.seed + 1, args.users, 1), args.device_pages, sg)  # warm-up
    records = []
    for run in range(args.runs):
        systems = replay(trace, args.device_pages, sg)
        records += [run_record(run, name, s, prompt_tokens) for name, s in systems.items()]
        limit = memcmp_floor_samples_ns(limit_len, LIMIT_REPEATS, args.seed + run)
        records.append({"run": run, "system": LIMIT, "samples_ns": {"match": limit}})
        p50s = {name: statistics.median(s.samples["match"]) / 1e3 for name, s in systems.items()}
        print(
            f"run {run + 1}/{args.runs}: match p50 µs "
            + ", ".join(f"{name} {us:.1f}" for name, us in p50s.items())
        )
    return records


def _settings(trace: list[Turn], args: argparse.Namespace) -> dict[str, Any]:
    lengths = [len(turn.prompt) for turn in trace]
    return {
        "users": args.users,
        "rounds": args.rounds,
        "device_pages": args.device_pages,
        "runs": args.runs,
        "seed": args.seed,
        "page_size": PAGE_SIZE,
        "chunk_tokens": CHUNK_TOKENS,
        "prompt_len_min": min(lengths),
        "prompt_len_max": max(lengths),
        "limit_prompt_len": int(statistics.median(lengths)),
        "torch": torch.__version__,
    }


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--device-pages", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sglang", action="store_true", help="time tieredkv alone")
    parser.add_argument(
        "--out", type=Path, help=f"result folder (default {RESULTS_DIR}/<UTC YYYY-MM-DDTHHMM>)"
    )
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        sg = None if args.no_sglang else load_sglang()
    except SglangMissingError as error:
        print(f"radix_vs_sglang: {error}", file=sys.stderr)
        return 2
    peers = {} if sg is None else {"sglang": {"version": sg.sglang.__version__}}
    print(f"torch {torch.__version__}; SGLang " + (peers["sglang"]["version"] if sg else "absent"))
    trace = make_trace(args.seed, args.users, args.rounds)
    records = measure(trace, args, sg)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M")
    out = args.out or RESULTS_DIR / stamp
    runner = [".venv/bin/python", "-m", "benchmarks.radix_vs_sglang"]
    command = ["benchmarks/sglang_radix.sh", "run"] if sg else runner
    path = write_result(
        out,
        BENCHMARK,
        settings=_settings(trace, args),
        summary=summarise(records),
        records=records,
        peers=peers,
        argv=command + argv,
    )
    print(f"wrote {path}\n")
    result = json.loads(path.read_text())
    result["dir"] = _relative(out.resolve(), RESULTS_DIR.parent)
    print(render_markdown([result]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

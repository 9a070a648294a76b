"""The write-policy x page-size grid on the multi-turn chat workload: the data behind the defaults
of `tieredkv serve --write-policy` and `--page-size`. tieredkv is started once per cell (a fresh
disk store each, dropped from the page cache before each round, as `tieredkv bench multiturn`
does); the best cell has the lowest reuse-round TTFT p50 (ties: the higher hit ratio).

    .venv/bin/python benchmarks/policy_grid.py [--preset default] [--dtype bfloat16]
        [--device-cache-size 192MiB] [--host-cache-size 64MiB] [--page-sizes 8,16,32] [--json PATH]

The workload comes from `tieredkv bench multiturn`'s presets; the server sizes default to the
preset's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from tieredkv.bench.disk_check import disk_read_limit
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.multiturn import PRESETS
from tieredkv.bench.records import TIERS, fmt
from tieredkv.bench.suite import ServerSpec, SuiteConfig, run_all
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.config import WritePolicy
from tieredkv.errors import TieredKVError

WRITE_POLICIES = tuple(policy.value for policy in WritePolicy)
PAGE_SIZES = (8, 16, 32)


def grid_specs(base: ServerSpec, page_sizes: tuple[int, ...] = PAGE_SIZES) -> list[ServerSpec]:
    """`base` at every write policy x page size."""
    return [
        ServerSpec(
            f"{policy} page {size}",
            base.device_cache,
            base.host_cache,
            base.disk_cache,
            page_size=size,
            write_policy=policy,
        )
        for policy in WRITE_POLICIES
        for size in page_sizes
    ]


def grid_summary(runs: list[dict]) -> dict:
    """{"table": Markdown, "cells": [...], "best": {"write_policy", "page_size"} or None}."""
    cells = []
    for run in runs:
        summary = run["summary"]["reuse_rounds"] or run["summary"]["overall"]
        cells.append(
            {
                "write_policy": run["spec"]["write_policy"],
                "page_size": run["spec"]["page_size"],
                "ttft_p50_s": summary["ttft_s"]["p50"],
                "hit_ratio": summary["hit_ratio"],
                "hit_ratio_by_tier": summary["hit_ratio_by_tier"],
                "errors": summary["errors"],
            }
        )
    ranked = [c for c in cells if c["ttft_p50_s"] is not None and not c["errors"]]
    ranked.sort(key=lambda c: (c["ttft_p50_s"], -(c["hit_ratio"] or 0.0)))
    best = ranked[0] if ranked else None
    lines = [
        "| write policy | page size | TTFT p50 ms | hit | hit device | hit host | hit disk "
        "| hit remote |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        tiers = " | ".join(fmt(c["hit_ratio_by_tier"].get(t), ".1%") for t in TIERS)
        lines.append(
            f"| {c['write_policy']} | {c['page_size']} | {fmt(c['ttft_p50_s'], '.0f', 1000)} "
            f"| {fmt(c['hit_ratio'], '.1%')} | {tiers} |"
        )
    return {
        "table": "\n".join(lines),
        "cells": cells,
        "best": None if best is None else {k: best[k] for k in ("write_policy", "page_size")},
    }


def _page_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 8,16,32, got {text!r}") from None
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/policy_grid.py", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--preset", choices=sorted(PRESETS), default="default")
    add("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    add("--seed", type=int, default=0)
    add("--device-cache-size", dest="device_cache", help="default: the preset's")
    add("--host-cache-size", dest="host_cache", help="default: the preset's")
    add("--disk-cache-size", dest="disk_cache", help="default: the preset's")
    add("--page-sizes", type=_page_sizes, default=PAGE_SIZES, help="comma-separated")
    add("--threads", type=int, default=None, help="OMP_NUM_THREADS of the servers")
    add("--work-dir", type=Path, help="logs and disk stores (default: a temp dir)")
    add("--json", type=Path, default=None, metavar="PATH", help="also write every run here")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    preset = PRESETS[args.preset]
    workload = WorkloadConfig(
        preset["users"], preset["rounds"], preset["system_words"], preset["document_words"],
        preset["max_tokens"], args.seed,
    )  # fmt: skip
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tieredkv-grid-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    common = ["--dtype", args.dtype, "--max-model-len", str(preset["max_model_len"])]
    suite = SuiteConfig([*common, "--max-num-seqs", "3"], work_dir, args.threads)
    base = ServerSpec(
        "tieredkv",
        args.device_cache or preset["device_cache"],
        args.host_cache or preset["host_cache"],
        args.disk_cache or preset["disk_cache"],
    )
    try:
        disk = disk_read_limit(suite.work_dir, suite.disk_probe_bytes)
        runs = run_all(
            grid_specs(base, args.page_sizes), suite, Workload(workload), ArrivalConfig(1)
        )
    except (TieredKVError, OSError) as exc:
        print(f"policy_grid: error: {exc}", file=sys.stderr)
        return 1
    summary = grid_summary(runs)
    print(f"disk read bandwidth (same run): {disk['bytes_per_s'] / 1e9:.2f} GB/s")
    print(summary["table"])
    print(f"best: {summary['best']}")
    if args.json is not None:
        report = {"command": ["benchmarks/policy_grid.py", *argv], "disk": disk}
        report |= {"workload": dataclasses.asdict(workload), **summary, "runs": runs}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`tieredkv bench tiers`: tier transfer bandwidth beside this machine's limits, in one run.

Limits (tier_limits): numpy memcpy on one thread and on two, xxh3 on one core, raw O_DIRECT
write and read of a file of --raw-bytes (>= 1 GiB by default) under --dir. Tiers, for realistic
pages (the default model in bf16, 368,640 B) in batches: host<->device and host<->disk through
the transfer jobs (tier_copies), as the server runs them (a host<->device job of 16+
pages shares its copy with a helper thread; `threads` says how many copied). Targets: disk
paths >= 80% of raw disk, memory paths >= 70% of memcpy on as many threads as the job copied
on. --memory-only skips every disk figure. Seeded, one warm-up; each row is the median
repetition, with the slowest and the fastest. `--out DIR` writes DIR/result.json
(benchmarks/tier_bandwidth.py renders such files for docs/benchmarks.md).
(benchmarks/tier_breakdown.py times each stage of the jobs, and the disk store alone.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tieredkv.bench.result_file import write_result
from tieredkv.bench.tier_copies import make_transfer_jobs, transfer_disk_gbps
from tieredkv.bench.tier_limits import (
    RAW_PATTERNS,
    Rate,
    memcpy_gbps,
    raw_disk_gbps,
    xxh3_gbps,
)
from tieredkv.bench.tier_rows import DISK_TARGET, MOVER, BandwidthRow, memory_rows
from tieredkv.bench.tier_store import LAYOUT
from tieredkv.cache.disk.store import CHUNK_BYTES, IO_DEPTH, IO_THREADS, DiskStore


def _counts(text: str) -> list[int]:
    """A comma-separated list of positive integers (argparse type)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 64,256, got {text!r}") from None
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return counts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tieredkv bench tiers", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--dir", type=Path, default=None, help="where temp files go (default: ~/.cache/tieredkv)")
    add("--json", type=Path, default=None, metavar="PATH", help="also write the report here")
    add("--out", type=Path, default=None, metavar="DIR", help="write DIR/result.json")
    add(
        "--batches",
        type=_counts,
        default=[64, 256, 1024],
        help="pages per transfer, comma-separated",
    )
    add("--reps", type=int, default=5, help="timed repetitions (medians), after one warm-up")
    add("--seed", type=int, default=0)
    add("--raw-bytes", type=int, default=1 << 30, help="raw O_DIRECT file (and store) size")
    add("--memcpy-bytes", type=int, default=512 << 20)
    add("--memory-only", action="store_true", help="only memcpy and host<->device (no disk)")
    add("--quick", action="store_true", help="tiny sizes, for tests (figures meaningless)")
    return parser


def _quick(args: argparse.Namespace) -> None:
    args.batches, args.reps = [4, 16], 1
    args.raw_bytes, args.memcpy_bytes = 16 << 20, 16 << 20


def default_dir() -> Path:
    """A directory on the same filesystem as ~/.cache (where `serve` keeps its disk tier)."""
    directory = Path.home() / ".cache" / "tieredkv"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def measure(args: argparse.Namespace, directory: Path) -> dict[str, object]:
    """Every limit and every row, as the JSON report (no disk figures with --memory-only)."""
    rng = np.random.default_rng(args.seed)
    batches = args.batches
    memcpy = memcpy_gbps(args.memcpy_bytes, args.reps, rng)
    memcpy_2t = memcpy_gbps(args.memcpy_bytes, args.reps, rng, threads=2)
    limits: dict[str, object] = {"memcpy_gbps": memcpy, "memcpy_2t_gbps": memcpy_2t}
    if args.memory_only:
        transfer_jobs = make_transfer_jobs(2 * max(batches), None, args.seed)
        try:
            rows = memory_rows(
                transfer_jobs, args.batches, args.reps, args.seed, {1: memcpy, 2: memcpy_2t}
            )
        finally:
            transfer_jobs.close()
        direct_io = None
    else:
        rows, direct_io = _all_rows(args, directory, rng, limits)
    return {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "dir": str(directory)},
        "settings": {
            "seed": args.seed,
            "reps": args.reps,
            "page_bytes": LAYOUT.page_bytes,
            "store_config": f"{IO_THREADS}:{IO_DEPTH}:{CHUNK_BYTES >> 20}",
            "quick": args.quick,
            "memory_only": args.memory_only,
        },
        "limits": limits,
        "store_direct_io": direct_io,
        "rows": [row.to_json() for row in rows],
    }


def _all_rows(
    args: argparse.Namespace,
    directory: Path,
    rng: np.random.Generator,
    limits: dict[str, object],
) -> tuple[list[BandwidthRow], bool]:
    """The disk limits (added to `limits`), then the memory, transfer-job disk and DiskStore
    rows."""
    batches = args.batches
    patterns = RAW_PATTERNS[:1] if args.quick else RAW_PATTERNS
    limits["xxh3_gbps"] = xxh3_gbps(args.memcpy_bytes, args.reps, rng)
    raw = [
        raw_disk_gbps(directory / "raw.bin", args.raw_bytes, args.reps, rng, mib, depth)
        for mib, depth in patterns
    ]
    raw_write = max(r.write_gbps for r in raw)
    raw_read = max(r.read_gbps for r in raw)
    limits |= {
        "raw_write_gbps": raw_write,
        "raw_read_gbps": raw_read,
        "raw_patterns": [asdict(r) for r in raw],
    }
    # the store spans as much disk as the raw file (and at least two largest batches)
    capacity = max(args.raw_bytes, 2 * max(batches) * LAYOUT.page_bytes) + (16 << 20)
    store = DiskStore(directory / "store", b"bench", LAYOUT, capacity)
    disk_limit = {
        "host->disk": ("raw disk write", raw_write, DISK_TARGET),
        "disk->host": ("raw disk read", raw_read, DISK_TARGET),
    }

    def disk_row(path: str, via: str, batch: int, rate: Rate, ok: bool) -> BandwidthRow:
        return BandwidthRow(path, via, batch, rate, *disk_limit[path], ok)

    try:
        transfer_jobs = make_transfer_jobs(2 * max(batches), store, args.seed)
        try:
            memcpy, memcpy_2t = limits["memcpy_gbps"], limits["memcpy_2t_gbps"]
            assert isinstance(memcpy, float) and isinstance(memcpy_2t, float)
            memcpy_by_threads = {1: memcpy, 2: memcpy_2t}
            rows = memory_rows(transfer_jobs, args.batches, args.reps, args.seed, memcpy_by_threads)
            for batch in batches:
                write, read, ok = transfer_disk_gbps(transfer_jobs, store, batch, args.reps, rng)
                rows.append(disk_row("host->disk", MOVER, batch, write, ok))
                rows.append(disk_row("disk->host", MOVER, batch, read, ok))
        finally:
            transfer_jobs.close()
        return rows, store.direct_io
    finally:
        store.close()


def print_report(report: dict) -> None:
    """The report as a table for people (the JSON holds the same)."""
    limits, settings = report["limits"], report["settings"]
    direct_io = report["store_direct_io"]
    store = "n/a" if direct_io is None else ("on" if direct_io else "OFF")
    print(
        f"{report['machine']['cpus']} CPUs usable, page {settings['page_bytes']:,} B, "
        f"seed {settings['seed']}, median (min-max) of {settings['reps']} after 1 warm-up, "
        f"store O_DIRECT {store}"
    )
    line = (
        f"limits: memcpy {limits['memcpy_gbps']:.2f} GB/s on 1 thread, "
        f"{limits['memcpy_2t_gbps']:.2f} GB/s on 2"
    )
    if "xxh3_gbps" in limits:
        line += f", xxh3 {limits['xxh3_gbps']:.2f} GB/s"
    print(line)
    for r in limits.get("raw_patterns", []):
        print(
            f"  raw O_DIRECT {r['request_mib']} MiB x {r['in_flight']} in flight: "
            f"write {r['write_gbps']:.2f} GB/s, read {r['read_gbps']:.2f} GB/s"
        )
    print(
        f"{'path':<14}{'via':<42}{'pages':>6}{'thr':>4}{'GB/s (min-max)':>20}  {'limit':<20}"
        f"{'GB/s':>7}"
        f"{'share':>7}{'target':>7}"
    )
    for row in report["rows"]:
        mark = ("" if row["meets_target"] else "  MISS") + ("" if row["verified"] else "  BAD")
        threads = "" if row["threads"] is None else row["threads"]
        print(
            f"{row['path']:<14}{row['via']:<42}{row['batch_pages']:>6}{threads:>4}"
            f"{_spread(row):>20}  {row['limit']:<20}{row['limit_gbps']:>7.2f}"
            f"{row['share']:>7.0%}{row['target']:>7.0%}{mark}"
        )


def _spread(row: dict) -> str:
    return f"{row['gbps']:.2f} ({row['gbps_min']:.2f}-{row['gbps_max']:.2f})"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        _quick(args)
    root = args.dir if args.dir is not None else default_dir()
    try:
        with tempfile.TemporaryDirectory(dir=root, prefix="tieredkv-bench-") as tmp:
            report = measure(args, Path(tmp))
    except OSError as error:  # e.g. a --dir whose filesystem refuses O_DIRECT, or is full
        print(f"tieredkv bench tiers: error: {error} (under {root})", file=sys.stderr)
        return 1
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.out is not None:
        summary = {"limits": report["limits"], "store_direct_io": report["store_direct_io"]}
        settings = {**report["settings"], "batches": args.batches, "dir": str(root)}
        argv = ["tieredkv", "bench", "tiers", *(sys.argv[1:] if argv is None else argv)]
        path = write_result(args.out, "tier_bandwidth", settings=settings, summary=summary,
                            records=report["rows"], argv=argv)  # fmt: skip
        print(f"result: {path}")
    return 0

"""Tier transfer bandwidth beside this machine's own limits: `tieredkv bench tiers`.

    .venv/bin/python benchmarks/tier_bandwidth.py [--dir DIR] [--batches 64,256,1024]
        [--out benchmarks/results/tier_bandwidth/YYYY-MM-DDTHHMM]

The measurement lives in tieredkv/bench/tiers.py (and tier_limits, tier_store, tier_copies);
`render_markdown` turns its committed result files into a section of docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from tieredkv.bench.records import fmt, fmt_spread, percentile, spread
from tieredkv.bench.result_file import machine_line
from tieredkv.bench.tiers import main

HEADER = (
    "| path | via | pages | threads | GB/s | limit | limit GB/s | share | target | met |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _row_key(row: dict) -> tuple:
    return (row["path"], row["via"], row["batch_pages"], row["threads"] or 0, row["limit"])


def _table(results: list[dict]) -> str:
    """One line per measured path and batch: the median of the runs' median repetitions, with
    the slowest and the fastest repetition of any run."""
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for result in results:
        for row in result["records"]:
            rows[_row_key(row)].append(row)
    lines = [HEADER]
    for key in sorted(rows):
        path, via, batch, threads, limit = key
        same = rows[key]
        gbps = spread([r["gbps"] for r in same])
        gbps |= {"min": min(r["gbps_min"] for r in same), "max": max(r["gbps_max"] for r in same)}
        limit_gbps = spread([r["limit_gbps"] for r in same])
        share = percentile([r["share"] for r in same], 50)
        target = same[0]["target"]
        met = "yes" if share >= target and all(r["verified"] for r in same) else "NO"
        lines.append(
            f"| {path} | {via} | {batch} | {threads or ''} | {fmt_spread(gbps, '.2f')} "
            f"| {limit} | {fmt_spread(limit_gbps, '.2f')} | {fmt(share, '.0%')} "
            f"| {fmt(target, '.0%')} | {met} |"
        )
    return "\n".join(lines)


def render_markdown(results: list[dict]) -> str:
    """The tier bandwidth section: per machine, each path's GB/s beside its limit measured in
    the same run at the same parallelism, medians over the runs with (min-max)."""
    by_machine: dict[str, list[dict]] = defaultdict(list)
    for result in results:
        by_machine[machine_line(result)].append(result)
    parts = [
        "## Tier bandwidth\n",
        "`tieredkv bench tiers`: host<->device through the transfer jobs the server runs, "
        "host<->disk through them and the disk store, each beside the limit it is judged against: "
        "memcpy on as many threads as the copy ran on, raw O_DIRECT disk in the same direction. "
        "Each run's figure is its median repetition; the table gives the median over runs, with "
        "(the slowest - the fastest) repetition of any run.\n",
    ]
    for machine in sorted(by_machine):
        group = by_machine[machine]
        dirs = ", ".join(f"`{result['dir']}`" for result in group)
        commands = sorted({" ".join(result["command"]) for result in group})
        parts.append(f"Machine: {machine}; {len(group)} run(s): {dirs}.")
        parts.append("Command: " + "; ".join(f"`{command}`" for command in commands) + "\n")
        parts.append(_table(group) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`tieredkv bench multiturn`'s managed runs at several (device, host) cache sizes, beside one
recompute baseline: TTFT and hit ratio per tier against the budget, in one run.

    .venv/bin/python -m benchmarks.capacity_sweep --sweep DEVICE:HOST[,DEVICE:HOST...]
        [bench multiturn's flags for managed runs]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tieredkv.bench import multiturn
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.records import TIERS, fmt, fmt_times
from tieredkv.bench.suite import ServerSpec, SuiteConfig, run_all
from tieredkv.bench.tables import HIT_COLUMNS, markdown_table, reuse_summary, speedup
from tieredkv.bench.workload import Workload
from tieredkv.config import parse_size
from tieredkv.errors import ConfigError


def parse_sweep(text: str) -> list[tuple[str, str]]:
    """ "DEVICE:HOST,DEVICE:HOST" as (device, host) size strings; ConfigError names a bad one."""
    pairs = []
    for item in text.split(","):
        device, sep, host = item.strip().partition(":")
        if not sep:
            raise ConfigError(f"--sweep: expected DEVICE:HOST, got {item!r}")
        for size in (device, host):
            parse_size(size)  # ConfigError names a bad size
        pairs.append((device, host))
    return pairs


def sweep_table(runs: list[dict], baseline: dict | None) -> str:
    """TTFT p50 and hit ratio per tier against the device + host budget (reuse rounds)."""
    header = ["device", "host", "TTFT p50 ms", "vs recompute", *HIT_COLUMNS]
    rows = []
    for run in runs:
        summary = reuse_summary(run)
        rows.append([
            run["spec"]["device_cache"], run["spec"]["host_cache"],
            fmt(summary["ttft_s"]["p50"], ".0f", 1000), fmt_times(speedup(run, baseline)),
            *(fmt(summary["hit_ratio_by_tier"][t], ".1%") for t in TIERS),
        ])  # fmt: skip
    return markdown_table(header, rows)


def main(argv: list[str]) -> int:
    parser = multiturn.build_parser()
    parser.prog = "python -m benchmarks.capacity_sweep"
    parser.add_argument("--sweep", required=True, help="DEVICE:HOST[,DEVICE:HOST...]")
    args = parser.parse_args(argv)
    try:
        pairs = parse_sweep(args.sweep)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.base_url:
        parser.error("--sweep starts its own servers: no --base-url")

    def run_configs(
        _args: argparse.Namespace,
        spec: ServerSpec,
        suite: SuiteConfig,
        workload: Workload,
        arrival: ArrivalConfig,
        report: dict,
    ) -> list[dict]:
        label = "tieredkv {}+{}"
        specs = [
            dataclasses.replace(spec, label=label.format(d, h), device_cache=d, host_cache=h)
            for d, h in pairs
        ]
        return run_all(specs, suite, workload, arrival, on_result=report["runs"].append)

    def add_table(report: dict, runs: list[dict], baseline: dict | None) -> None:
        report["sections"]["Capacity sweep"] = sweep_table(runs, baseline)

    return multiturn.main(argv, parser, run_configs, add_table)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

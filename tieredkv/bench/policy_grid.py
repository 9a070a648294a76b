"""The write-policy x page-size comparison on the benchmark's workload: the data behind the
defaults of `tieredkv serve --write-policy` and `--page-size`. The best cell is the one with the
lowest reuse-round TTFT p50 (ties: the higher hit ratio)."""

from __future__ import annotations

from tieredkv.bench.records import TIERS, fmt
from tieredkv.bench.suite import ServerSpec

WRITE_POLICIES = ("write_back", "write_through")
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
        "| write policy | page size | TTFT p50 ms | hit | hit device | hit host | hit disk |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        tiers = " | ".join(fmt(c["hit_ratio_by_tier"][t], ".1%") for t in TIERS)
        lines.append(
            f"| {c['write_policy']} | {c['page_size']} | {fmt(c['ttft_p50_s'], '.0f', 1000)} "
            f"| {fmt(c['hit_ratio'], '.1%')} | {tiers} |"
        )
    return {
        "table": "\n".join(lines),
        "cells": cells,
        "best": None if best is None else {k: best[k] for k in ("write_policy", "page_size")},
    }

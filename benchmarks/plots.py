"""PNG plots of a `tieredkv bench multiturn` report: TTFT by round, hit ratio by tier,
promotion latency distribution, and the capacity sweep. Unknown values are left out of a plot
(and labelled so), never drawn as 0.

    .venv/bin/python -m benchmarks.plots REPORT_DIR   (writes the PNGs beside its report.json)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tieredkv.bench.records import TIERS
from tieredkv.config import parse_size
from tieredkv.errors import TieredKVError

TIER_COLORS = {"device": "#2b6cb0", "host": "#38a169", "disk": "#dd6b20", "remote": "#805ad5"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise TieredKVError("the plots need matplotlib: pip install 'tieredkv[bench]'") from None

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def _nan(value: float | None, scale: float = 1.0) -> float:
    return math.nan if value is None else value * scale


def ttft_by_round(runs: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        p50 = [_nan(s["ttft_s"]["p50"], 1000) for s in run["summary"]["by_round"]]
        ax.plot(range(len(p50)), p50, marker="o", label=run["label"])
    ax.set_xticks(range(max(len(r["summary"]["by_round"]) for r in runs)))
    ax.set_xlabel("round (0 builds each conversation)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_yscale("log")
    ax.set_title("Time to first token by round")
    ax.legend(fontsize="small")
    return _save(fig, path)


def hit_ratio_by_tier(runs: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(runs)), 4))
    bottoms = [0.0] * len(runs)
    for tier in TIERS:
        values = []
        for run in runs:
            summary = run["summary"]["reuse_rounds"] or run["summary"]["overall"]
            values.append(summary["hit_ratio_by_tier"].get(tier))  # older reports: 3 tiers
        heights = [0.0 if v is None else v for v in values]
        ax.bar(range(len(runs)), heights, bottom=bottoms, color=TIER_COLORS[tier], label=tier)
        for i, value in enumerate(values):
            if value is None:
                ax.text(i, bottoms[i] + 0.02, f"{tier}: unknown", ha="center", fontsize=7)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(runs)), [r["label"] for r in runs], rotation=20, fontsize=8)
    ax.set_ylabel("share of prompt tokens (reuse rounds)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Cache hit ratio by tier")
    ax.legend(fontsize="small")
    return _save(fig, path)


def promotion_distribution(run: dict, path: Path) -> Path:
    """Observations per histogram bucket (bucket resolution), per source tier."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for offset, source in ((-0.2, "host"), (0.2, "disk")):
        stats = (run.get("promotion") or {}).get(source) or {}
        buckets = stats.get("buckets")
        if not buckets or not stats.get("count"):
            continue
        finite = [(b, c) for b, c in buckets if not math.isinf(b)]
        counts = [c - (finite[i - 1][1] if i else 0.0) for i, (_, c) in enumerate(finite)]
        xs = [i + offset for i in range(len(finite))]
        ax.bar(xs, counts, width=0.4, color=TIER_COLORS[source], label=f"from {source}")
        ax.set_xticks(range(len(finite)), [f"≤{b * 1000:g}" for b, _ in finite], rotation=60)
        drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "promotion latency: unknown (no tieredkv metrics)", ha="center",
                transform=ax.transAxes)  # fmt: skip
    ax.set_xlabel("promotion latency bucket (ms)")
    ax.set_ylabel("requests")
    ax.set_title(f"Promotion latency ({run['label']}, bucket resolution)")
    if drawn:
        ax.legend(fontsize="small")
    return _save(fig, path)


def capacity_sweep(runs: list[dict], path: Path) -> Path:
    """TTFT p50 and hit ratio per tier against the device + host budget."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    budgets = [
        (parse_size(r["spec"]["device_cache"]) + parse_size(r["spec"]["host_cache"])) / 2**20
        for r in runs
    ]
    summaries = [r["summary"]["reuse_rounds"] or r["summary"]["overall"] for r in runs]
    ax.plot(budgets, [_nan(s["ttft_s"]["p50"], 1000) for s in summaries], "k-o", label="TTFT p50")
    ax.set_xlabel("device + host cache (MiB)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_yscale("log")
    hits = ax.twinx()
    for tier in TIERS:
        values = [_nan(s["hit_ratio_by_tier"].get(tier)) for s in summaries]
        hits.plot(budgets, values, "--s", color=TIER_COLORS[tier], label=f"hit {tier}")
    hits.set_ylabel("hit ratio")
    hits.set_ylim(0, 1.05)
    lines, labels = ax.get_legend_handles_labels()
    more_lines, more_labels = hits.get_legend_handles_labels()
    ax.legend(lines + more_lines, labels + more_labels, fontsize="small", loc="best")
    ax.set_title("Capacity sweep (reuse rounds)")
    return _save(fig, path)


def _save(fig: object, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def draw(report_dir: Path) -> list[Path]:
    """Every plot of `report_dir/report.json`, written beside it; their paths."""
    runs = json.loads((report_dir / "report.json").read_text())["runs"]
    paths = [
        ttft_by_round(runs, report_dir / "ttft_by_round.png"),
        hit_ratio_by_tier(runs, report_dir / "hit_ratio_by_tier.png"),
        promotion_distribution(runs[0], report_dir / "promotion_latency.png"),
    ]
    sweep = [run for run in runs if run["label"].startswith("tieredkv ") and "spec" in run]
    if len(sweep) > 1:  # benchmarks/capacity_sweep.py labels its runs "tieredkv DEVICE+HOST"
        paths.append(capacity_sweep(sweep, report_dir / "sweep.png"))
    return paths


if __name__ == "__main__":
    for written in draw(Path(sys.argv[1])):
        print(written)

"""Markdown tables for people (the same figures as the JSON report; unknown prints "unknown").
Timed figures are over the reuse rounds (round >= 1); round 0 builds every conversation and
is shown in the per-round table only."""

from __future__ import annotations

from tieredkv.bench.records import TIERS, fmt, fmt_p99, fmt_times, ratio

HIT_COLUMNS = tuple(f"hit {tier}" for tier in TIERS)  # one per tier, remote included


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: the header, its rule, one line per row."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def reuse_summary(run: dict) -> dict:
    """The run's summary over the reuse rounds (all rounds when there is one)."""
    return run["summary"]["reuse_rounds"] or run["summary"]["overall"]


def speedup(run: dict, baseline: dict | None) -> float | None:
    """Baseline TTFT p50 / this run's TTFT p50, over the reuse rounds."""
    if baseline is None:
        return None
    return ratio(reuse_summary(baseline)["ttft_s"]["p50"], reuse_summary(run)["ttft_s"]["p50"])


def runs_table(runs: list[dict], baseline: dict | None) -> str:
    """One row per run: TTFT percentiles, speed-up vs recompute, hit ratio per tier, promotion
    latency per source tier (bucket estimates), output throughput."""
    header = ["run", "TTFT p50 ms", "p90 ms", "p99 ms", "vs recompute", "hit", *HIT_COLUMNS,
              "server promo host p50/p99 ms", "server promo disk p50/p99 ms", "out tok/s",
              "O_DIRECT"]  # fmt: skip
    rows = []
    for run in runs:
        summary = reuse_summary(run)
        ttft = summary["ttft_s"]
        hits = summary["hit_ratio_by_tier"]
        promo = run.get("promotion") or {}
        rows.append(
            [
                run["label"],
                *(fmt(ttft[q], ".0f", 1000) for q in ("p50", "p90")),
                fmt_p99(ttft, ".0f", 1000),
                fmt_times(speedup(run, baseline)),
                fmt(summary["hit_ratio"], ".1%"),
                *(fmt(hits[t], ".1%") for t in TIERS),
                *(_promo(promo.get(t)) for t in ("host", "disk")),
                fmt(summary["output_tokens_per_s"], ".1f"),
                {True: "on", False: "off"}.get(run.get("direct_io"), "unknown"),
            ]
        )
    return markdown_table(header, rows)


def _promo(stats: dict | None) -> str:
    if not stats or not stats["count"]:
        return "unknown" if not stats or stats["count"] is None else "none"
    p99 = fmt_p99({"p99": stats["p99_s"], "n": stats["count"]}, ".1f", 1000)
    return f"{fmt(stats['p50_s'], '.1f', 1000)} / {p99}"


def rounds_table(run: dict) -> str:
    header = ["round", "requests", "prompt tok/req", "TTFT p50 ms", "p90 ms", "p99 ms",
              *HIT_COLUMNS]  # fmt: skip
    rows = []
    for index, summary in enumerate(run["summary"]["by_round"]):
        rows.append(
            [
                str(index),
                str(summary["requests"]),
                fmt(ratio(summary["prompt_tokens"], summary["requests"]), ".0f"),
                *(fmt(summary["ttft_s"][q], ".0f", 1000) for q in ("p50", "p90")),
                fmt_p99(summary["ttft_s"], ".0f", 1000),
                *(fmt(summary["hit_ratio_by_tier"][t], ".1%") for t in TIERS),
            ]
        )
    return markdown_table(header, rows)

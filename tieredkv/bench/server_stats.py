"""What a tieredkv server's `/metrics` says about one run: the difference between a scrape at
the start and one at the end. Server-reported figures are diagnostics beside the client's own.
Promotion percentiles are bucket-resolution estimates (buckets 1 ms x 2^k: a p50 of 0.006 s
means "between 4 and 8 ms, interpolated"); a p99 needs 100 observations. Every value is None
(unknown) when the server does not expose the metric (any non-tieredkv server)."""

from __future__ import annotations

from tieredkv.bench.prom_text import (
    bucket_quantile,
    counter_delta,
    histogram_count,
    histogram_delta,
    parse_samples,
)
from tieredkv.bench.records import P99_MIN_SAMPLES, TIERS, ratio

PROMOTION_SOURCES = ("host", "disk", "remote")


def promotion_stats(before_text: str | None, after_text: str | None) -> dict:
    """Per source tier: observations, p50/p99 (bucket estimates), mean, and bytes moved per
    promotion (bytes copied out of that tier during the run / promotions from it)."""
    before = parse_samples(before_text or "")
    after = parse_samples(after_text or "")
    stats = {}
    for source in PROMOTION_SOURCES:
        buckets = histogram_delta(before, after, "tieredkv_promotion_seconds", from_tier=source)
        count = histogram_count(buckets)
        total = counter_delta(before, after, "tieredkv_promotion_seconds_sum", from_tier=source)
        moved = _bytes_up_from(before, after, source)
        enough = buckets and (count or 0) >= P99_MIN_SAMPLES
        stats[source] = {
            "count": count,
            "p50_s": bucket_quantile(buckets, 0.5) if buckets else None,
            "p99_s": bucket_quantile(buckets, 0.99) if enough else None,
            "mean_s": ratio(total, count),
            "bytes_moved": moved,
            "bytes_per_promotion": ratio(moved, count),
            "buckets": buckets,
        }
    return stats


def _bytes_up_from(before: dict, after: dict, source: str) -> float | None:
    """Bytes read out of `source` towards the device: disk->host and disk->device (with no
    host tier a disk page goes straight to the device) for disk, host->device for host."""
    name = "tieredkv_transfer_bytes_total"
    targets = ("host", "device") if source == "disk" else ("device",)
    moved = [counter_delta(before, after, name, from_tier=source, to_tier=t) for t in targets]
    known = [m for m in moved if m is not None]
    return sum(known) if known else None


def transfer_bytes(before_text: str | None, after_text: str | None) -> dict[str, float] | None:
    """{"from->to": bytes} moved during the run; None when the server has no such metric."""
    before = parse_samples(before_text or "")
    after = parse_samples(after_text or "")
    result = {}
    for src in TIERS:
        for dst in TIERS:
            if src != dst:
                delta = counter_delta(
                    before, after, "tieredkv_transfer_bytes_total", from_tier=src, to_tier=dst
                )
                if delta is not None:
                    result[f"{src}->{dst}"] = delta
    return result or None

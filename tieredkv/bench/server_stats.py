"""What a tieredkv server's `/metrics` says about one run: the difference between a scrape at
the start and one at the end, and per request between scrapes around it. Promotion percentiles
are exact when every promotion was timed per request (one request in flight: the histogram's sum
moved by exactly that request's value); else they are bucket-resolution estimates (buckets
1 ms x 2^k: a p50 of 0.006 s means "between 4 and 8 ms, interpolated"), and say so. A p99 needs
100 observations. Every value is None (unknown) when the server does not expose the metric (any
non-tieredkv server)."""

from __future__ import annotations

from tieredkv.bench.prom_text import (
    bucket_quantile,
    counter_delta,
    histogram_count,
    histogram_delta,
    parse_samples,
)
from tieredkv.bench.records import P99_MIN_SAMPLES, TIERS, percentiles, ratio

PROMOTION_SOURCES = ("host", "disk", "remote")


def promotion_stats(
    before_text: str | None,
    after_text: str | None,
    per_request: dict[str, list[float]] | None = None,
) -> dict:
    """Per source tier: observations, p50/p99, mean, and bytes moved per promotion (bytes copied
    out of that tier during the run ÷ promotions from it). `per_request`: each source's exact
    per-request promotion times; used when they account for every observation."""
    before = parse_samples(before_text or "")
    after = parse_samples(after_text or "")
    stats = {}
    for source in PROMOTION_SOURCES:
        buckets = histogram_delta(before, after, "tieredkv_promotion_seconds", from_tier=source)
        count = histogram_count(buckets)
        total = counter_delta(before, after, "tieredkv_promotion_seconds_sum", from_tier=source)
        moved = _bytes_up_from(before, after, source)
        exact = (per_request or {}).get(source) or []
        if count and len(exact) == count:
            figures = percentiles(exact)
            p50, p99 = figures["p50"], figures["p99"]
            how = "exact: every promotion timed per request"
        else:
            p50 = bucket_quantile(buckets, 0.5) if buckets else None
            enough = buckets and (count or 0) >= P99_MIN_SAMPLES
            p99 = bucket_quantile(buckets, 0.99) if enough else None
            how = "estimate: bucket resolution (1 ms x 2^k buckets, linear inside a bucket)"
        stats[source] = {
            "count": count,
            "p50_s": p50,
            "p99_s": p99,
            "mean_s": ratio(total, count),
            "bytes_moved": moved,
            "bytes_per_promotion": ratio(moved, count),
            "buckets": buckets,
            "estimate": how,
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


def eviction_counts(before_text: str | None, after_text: str | None) -> dict[str, float] | None:
    before = parse_samples(before_text or "")
    after = parse_samples(after_text or "")
    result = {}
    for tier in TIERS:
        for action in ("demoted", "dropped"):
            delta = counter_delta(
                before, after, "tieredkv_evicted_pages_total", tier=tier, action=action
            )
            if delta is not None:
                result[f"{tier}:{action}"] = delta
    return result or None


def request_timings(
    before_text: str | None, after_text: str | None
) -> tuple[float | None, float | None, dict[str, float]]:
    """(queue seconds, TTFT seconds, {source tier: promotion seconds}) of the one request served
    between two scrapes, from the histograms' sums: a value only where exactly one observation
    was made (None, or a tier absent from the dict, otherwise)."""
    before = parse_samples(before_text or "")
    after = parse_samples(after_text or "")

    def single(name: str, **labels: str) -> float | None:
        count = counter_delta(before, after, f"{name}_count", **labels)
        total = counter_delta(before, after, f"{name}_sum", **labels)
        return total if count == 1 and total is not None else None

    promotions = {
        source: value
        for source in PROMOTION_SOURCES
        if (value := single("tieredkv_promotion_seconds", from_tier=source)) is not None
    }
    return (
        single("tieredkv_queue_seconds"),
        single("tieredkv_time_to_first_token_seconds"),
        promotions,
    )

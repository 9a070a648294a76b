"""Per-request measurements and their summaries. `None` always means *unknown* (the server did
not report it), never zero: a sum over requests with any unknown value is unknown."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

TIERS = ("device", "host", "disk", "remote")
P99_MIN_SAMPLES = 100  # fewer samples than this: no p99 (it would be the maximum, or near it)


@dataclasses.dataclass
class RequestRecord:
    """One request of the workload, as the client saw it."""

    user: int
    round_index: int
    start_s: float  # client clock when the request was sent
    ttft_s: float | None = None  # send to first content delta
    latency_s: float | None = None  # send to the end of the stream
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cached_by_tier: dict[str, int | None] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(TIERS)
    )
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """{"n", "p50", "p90", "p99"} of `values`; p99 only from P99_MIN_SAMPLES samples on."""
    enough = len(values) >= P99_MIN_SAMPLES
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99) if enough else None,
    }


def spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """{"n", "median", "min", "max"} of repeated runs' figures; all None when there are none
    or any is unknown."""
    if not values or any(v is None for v in values):
        return {"n": len(values), "median": None, "min": None, "max": None}
    return {"n": len(values), "median": percentile(values, 50), "min": min(values),
            "max": max(values)}  # fmt: skip


def known_sum(values: Iterable[int | float | None]) -> float | None:
    """The sum, or None when any value is unknown (or there are none)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else float(sum(values))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def summarize(records: Sequence[RequestRecord]) -> dict:
    """TTFT/latency percentiles, throughput and hit ratios (overall and per tier) of `records`."""
    done = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    latencies = [r.latency_s for r in done if r.latency_s is not None]
    prompt = known_sum(r.prompt_tokens for r in done)
    output = known_sum(r.output_tokens for r in done)
    wall = None
    if done and all(r.latency_s is not None for r in done):
        wall = max(r.start_s + r.latency_s for r in done) - min(r.start_s for r in done)
    return {
        "requests": len(records),
        "errors": len(records) - len(done),
        "ttft_s": percentiles(ttfts),
        "latency_s": percentiles(latencies),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "wall_s": wall,
        "output_tokens_per_s": ratio(output, wall),
        "requests_per_s": ratio(len(done), wall) if done else None,
        "hit_ratio": ratio(known_sum(r.cached_tokens for r in done), prompt),
        "hit_ratio_by_tier": {
            tier: ratio(known_sum(r.cached_by_tier.get(tier) for r in done), prompt)
            for tier in TIERS
        },
    }


def fmt(value: float | None, spec: str = ".3f", scale: float = 1.0) -> str:
    """A number for people; unknown values print as "unknown", never as 0."""
    return "unknown" if value is None else format(value * scale, spec)


def fmt_times(value: float | None) -> str:
    """A speed-up factor ("12.3x"), or "unknown"."""
    return "unknown" if value is None else f"{value:.1f}x"


def fmt_p99(figures: dict, spec: str = ".0f", scale: float = 1.0) -> str:
    """A `percentiles` p99, or "n<100" where too few samples back one."""
    if figures.get("p99") is None and (figures.get("n") or 0) < P99_MIN_SAMPLES:
        return f"n<{P99_MIN_SAMPLES}"
    return fmt(figures.get("p99"), spec, scale)


def fmt_spread(figures: dict, spec: str = ".0f", scale: float = 1.0) -> str:
    """A `spread` as "median (min-max)"; "unknown" without runs."""
    if figures["median"] is None:
        return "unknown"
    low, high = fmt(figures["min"], spec, scale), fmt(figures["max"], spec, scale)
    return f"{fmt(figures['median'], spec, scale)} ({low}-{high})"

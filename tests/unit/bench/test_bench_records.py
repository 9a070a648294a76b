"""Percentiles, summaries, and unknown values that stay unknown (never 0)."""

import pytest

from tieredkv.bench.records import (
    RequestRecord,
    fmt,
    fmt_p99,
    fmt_spread,
    known_sum,
    percentile,
    percentiles,
    spread,
    summarize,
)


def record(user: int, rnd: int, ttft: float, prompt: int | None, cached: int | None, **tiers):
    r = RequestRecord(user=user, round_index=rnd, start_s=float(rnd), ttft_s=ttft)
    r.latency_s = ttft + 1.0
    r.prompt_tokens = prompt
    r.output_tokens = 4
    r.cached_tokens = cached
    if tiers:
        r.cached_by_tier = {"device": 0, "host": 0, "disk": 0, "remote": 0, **tiers}
    return r


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 90) == pytest.approx(90.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_known_sum_is_unknown_when_any_value_is() -> None:
    assert known_sum([1, 2, 0]) == 3
    assert known_sum([1, None, 2]) is None
    assert known_sum([]) is None


def test_summary_hit_ratios_per_tier() -> None:
    records = [
        record(0, 1, 0.1, 100, 60, device=10, host=20, disk=30),
        record(1, 1, 0.3, 100, 0, device=0, host=0, disk=0),
    ]
    summary = summarize(records)
    assert summary["hit_ratio"] == pytest.approx(0.3)
    assert summary["hit_ratio_by_tier"] == pytest.approx(
        {"device": 0.05, "host": 0.1, "disk": 0.15, "remote": 0.0}
    )
    assert summary["ttft_s"]["p50"] == pytest.approx(0.2)
    assert summary["output_tokens"] == 8
    assert summary["wall_s"] == pytest.approx(1.3)  # first start 1.0 to last end 1.0 + 1.3
    assert summary["output_tokens_per_s"] == pytest.approx(8 / 1.3)


def test_unknown_is_not_zero() -> None:
    unknown = summarize([record(0, 1, 0.1, 100, None), record(1, 1, 0.1, 100, None)])
    assert unknown["hit_ratio"] is None
    assert unknown["hit_ratio_by_tier"] == {
        "device": None,
        "host": None,
        "disk": None,
        "remote": None,
    }
    zero = summarize([record(0, 1, 0.1, 100, 0, device=0, host=0, disk=0)])
    assert zero["hit_ratio"] == 0.0
    assert zero["hit_ratio_by_tier"]["disk"] == 0.0
    assert fmt(unknown["hit_ratio"], ".1%") == "unknown"
    assert fmt(zero["hit_ratio"], ".1%") == "0.0%"


def test_errors_are_counted_and_left_out_of_the_figures() -> None:
    failed = RequestRecord(user=2, round_index=1, start_s=0.0, error="HTTP 500")
    summary = summarize([record(0, 1, 0.2, 10, 5, device=5), failed])
    assert summary["requests"] == 2
    assert summary["errors"] == 1
    assert summary["ttft_s"]["n"] == 1 and summary["ttft_s"]["p50"] == pytest.approx(0.2)
    assert summary["hit_ratio"] == pytest.approx(0.5)


def test_p99_needs_a_hundred_samples() -> None:
    few = percentiles([float(i) for i in range(99)])
    assert few["n"] == 99 and few["p50"] == 49.0 and few["p99"] is None
    assert fmt_p99(few) == "n<100"
    many = percentiles([float(i) for i in range(101)])
    assert many["p99"] == pytest.approx(99.0)
    assert fmt_p99(many, ".1f") == "99.0"


def test_spread_is_the_median_with_min_and_max() -> None:
    runs = spread([3.0, 1.0, 2.0])
    assert runs == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0}
    assert fmt_spread(runs, ".1f") == "2.0 (1.0-3.0)"
    assert fmt_spread(spread([])) == "unknown"

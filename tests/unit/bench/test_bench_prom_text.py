"""Prometheus text parsing and histogram quantiles, against tieredkv's own /metrics text."""

import math

import pytest

from tieredkv.bench.prom_text import (
    bucket_quantile,
    parse_samples,
)
from tieredkv.bench.server_stats import promotion_stats, transfer_bytes
from tieredkv.cache.tier import Tier
from tieredkv.engine.metrics import EngineMetrics


def test_parse_labels_values_and_skip_comments() -> None:
    text = '# HELP x y\n# TYPE x counter\nx_total{a="1",b="two words"} 3.5\ny 2\nbad line\n'
    samples = parse_samples(text)
    assert samples[("x_total", (("a", "1"), ("b", "two words")))] == 3.5
    assert samples[("y", ())] == 2.0
    assert len(samples) == 2


def test_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.001, 0.0), (0.002, 10.0), (0.004, 20.0), (math.inf, 20.0)]
    assert bucket_quantile(buckets, 0.5) == pytest.approx(0.002)
    assert bucket_quantile(buckets, 0.25) == pytest.approx(0.0015)
    assert bucket_quantile(buckets, 0.75) == pytest.approx(0.003)
    assert bucket_quantile([(0.001, 0.0), (math.inf, 0.0)], 0.5) is None
    # in the +Inf bucket: the highest finite bound (a lower bound on the truth)
    assert bucket_quantile([(0.001, 0.0), (math.inf, 4.0)], 0.5) == pytest.approx(0.001)


def test_promotion_quantiles_from_deltas_of_real_metrics() -> None:
    metrics = EngineMetrics()
    for _ in range(5):
        metrics.on_promotion(Tier.DISK, 0.5)  # before the run: must not count
    before = metrics.render()
    for seconds in (0.003, 0.003, 0.003, 0.012):
        metrics.on_promotion(Tier.DISK, seconds)
    metrics.transfer_bytes.inc(8000.0, from_tier="disk", to_tier="host")
    after = metrics.render()
    stats = promotion_stats(before, after)
    disk = stats["disk"]
    assert disk["count"] == 4
    assert 0.002 <= disk["p50_s"] <= 0.004  # the (2 ms, 4 ms] bucket
    assert disk["p99_s"] is None  # 4 observations: no p99
    assert disk["mean_s"] == pytest.approx(0.00525)
    assert disk["bytes_moved"] == 8000.0
    assert disk["bytes_per_promotion"] == 2000.0
    assert stats["host"]["count"] == 0
    assert stats["host"]["p50_s"] is None  # no observations: unknown, not 0
    assert transfer_bytes(before, after)["disk->host"] == 8000.0

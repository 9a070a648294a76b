"""The periodic stats line: figures over the interval since the last line, read from the same
metrics `/metrics` serves; nothing while the engine is idle."""

from __future__ import annotations

from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.stats_line import STATS_INTERVAL_S, StatsLine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_busy_interval_gives_throughput_queues_and_tiers() -> None:
    metrics, clock = EngineMetrics(), Clock()
    metrics.prompt_tokens.inc(500)  # before the line's first interval: not counted
    line = StatsLine(metrics, clock)
    assert not line.due()
    metrics.prompt_tokens.inc(2000)
    metrics.generation_tokens.inc(300)
    metrics.cache_hit_tokens.inc(1500, tier="device")
    metrics.cache_hit_tokens.inc(500, tier="disk")
    metrics.set_queue_sizes(num_running=3, num_waiting=2)
    metrics.tier_capacity_bytes.set(1000, tier="device")
    metrics.tier_used_bytes.set(250, tier="device")
    metrics.tier_capacity_bytes.set(4000, tier="disk")
    metrics.tier_used_bytes.set(4000, tier="disk")
    clock.now += STATS_INTERVAL_S
    assert line.due()
    text = line.take()
    assert text is not None
    assert "prompt 200.0 tok/s" in text and "generation 30.0 tok/s" in text
    assert "running 3" in text and "waiting 2" in text
    assert "device 25% full, served 75% of prompt tokens" in text
    assert "disk 100% full, served 25% of prompt tokens" in text
    assert "host" not in text  # no capacity: a disabled tier is not shown
    assert not line.due()  # a new interval started


def test_an_idle_interval_gives_no_line() -> None:
    metrics, clock = EngineMetrics(), Clock()
    line = StatsLine(metrics, clock)
    clock.now += 3 * STATS_INTERVAL_S
    assert line.due() and line.take() is None
    metrics.set_queue_sizes(num_running=0, num_waiting=1)  # a request waits: not idle
    clock.now += STATS_INTERVAL_S
    assert "waiting 1" in (line.take() or "")

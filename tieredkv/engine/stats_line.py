"""One log line every STATS_INTERVAL_S while the engine is busy, as vLLM users are used to:
prompt and generation throughput, running and waiting requests, and per tier how full it is and
what share of the interval's prompt tokens it served. Read from the Prometheus metrics, so the
line and `/metrics` never disagree; an idle engine logs nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

from tieredkv.engine.metrics import TIER_LABELS, EngineMetrics

STATS_INTERVAL_S = 10.0


class StatsLine:
    """The figures since the last line, from `metrics`; `due()` says when the next is owed."""

    def __init__(self, metrics: EngineMetrics, clock: Callable[[], float] = time.monotonic):
        self.metrics = metrics
        self.clock = clock
        self._since = clock()
        self._counts = self._read_counts()

    def _read_counts(self) -> dict[str, float]:
        metrics = self.metrics
        counts = {
            "prompt": metrics.prompt_tokens.value(),
            "generation": metrics.generation_tokens.value(),
        }
        for tier in TIER_LABELS:
            counts[tier] = metrics.cache_hit_tokens.value(tier=tier)
        return counts

    def due(self) -> bool:
        return self.clock() - self._since >= STATS_INTERVAL_S

    def take(self) -> str | None:
        """The line for the interval since the last one, which starts a new interval; None
        when nothing ran, waited or moved in it."""
        now, counts = self.clock(), self._read_counts()
        seconds = max(now - self._since, 1e-9)
        moved = {name: counts[name] - self._counts[name] for name in counts}
        self._since, self._counts = now, counts
        running = self.metrics.requests_running.value()
        waiting = self.metrics.requests_waiting.value()
        if not (moved["prompt"] or moved["generation"] or running or waiting):
            return None
        parts = [
            f"prompt {moved['prompt'] / seconds:.1f} tok/s",
            f"generation {moved['generation'] / seconds:.1f} tok/s",
            f"running {running:.0f}",
            f"waiting {waiting:.0f}",
        ]
        for tier in TIER_LABELS:
            capacity = self.metrics.tier_capacity_bytes.value(tier=tier)
            if capacity:
                used = self.metrics.tier_used_bytes.value(tier=tier) / capacity
                served = moved[tier] / moved["prompt"] if moved["prompt"] else 0.0
                parts.append(f"{tier} {used:.0%} full, served {served:.0%} of prompt tokens")
        return "; ".join(parts)

"""What the engine records in `EngineMetrics`, and when: `EngineRecorder` turns the engine's
requests into `EngineMetrics`' event calls; once a step the engine hands it `StepFigures`, the
figures the gauges and the mirrored cache counters need, never the engine itself.

`cache_hit_tokens_total` counts what requests report in `cached_tokens_by_tier` (first
admission only, as usage does), not the cache's raw hit counter, which a preempted request's
re-admission would count twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.retention import RetentionFigures
from tieredkv.cache.tier import Tier
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.protocol import FinishReason
from tieredkv.engine.request import Request


@dataclass(frozen=True)
class StepFigures:
    """The step's time (and the scheduler's share of it: applying transfers, queue order,
    admission, page reservation and inserting computed pages), the queue sizes and the cache's
    counters and sizes at the end of a step."""

    step_seconds: float
    scheduler_seconds: float
    num_running: int
    num_waiting: int  # queued or promoting
    cache_counters: CacheCounters
    tier_used_bytes: Mapping[Tier, int]
    tier_capacity_bytes: Mapping[Tier, int]
    tier_cached_tokens: Mapping[str, Mapping[Tier, int]]  # layer kind -> tier -> tokens
    disk_page_errors: Mapping[DiskErrorReason, int]
    remote_page_errors: Mapping[str, int]
    retention: RetentionFigures | None = None


class EngineRecorder:
    """The engine's events, from its requests, to `EngineMetrics` (on the engine thread)."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self.hit_tokens = dict.fromkeys(Tier, 0)

    def on_request_arrived(self, request: Request) -> None:
        if request.num_preemptions == 0:
            self.metrics.on_request_arrived(len(request.spec.prompt_ids))

    def on_promotion_done(self, request: Request) -> None:
        if request.num_preemptions:
            return
        for tier, tokens in request.cached_by_tier.items():
            self.hit_tokens[tier] += tokens
            if tier is not Tier.DEVICE and tokens and request.promotion_seconds is not None:
                self.metrics.on_promotion(tier, request.promotion_seconds)

    def on_first_forward(self, request: Request) -> None:
        assert request.first_forward_at is not None
        self.metrics.on_first_forward(request.first_forward_at - request.spec.arrival_time)

    def on_prefill(self, num_tokens: int) -> None:
        """Prompt tokens forwarded in a step."""
        self.metrics.on_prefill(num_tokens)

    def on_token(self, request: Request, now: float) -> None:
        self.metrics.on_tokens_generated(1)
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.on_first_token(now - request.spec.arrival_time)
        request.last_token_at = now

    def on_preemption(self) -> None:
        self.metrics.on_preemption()

    def on_deferred_admission(self) -> None:
        """A request first waited for a running request computing a prefix it shares."""
        self.metrics.on_deferred_admission()

    def on_request_finished(self, request: Request, reason: FinishReason, now: float) -> None:
        arrival = request.spec.arrival_time
        ttft = None if request.first_token_at is None else request.first_token_at - arrival
        self.metrics.on_request_finished(reason, now - arrival, len(request.output_ids), ttft)

    def on_step(self, figures: StepFigures) -> None:
        """Step times, queue sizes and the cache's counters and sizes, once per step."""
        self.metrics.on_step(figures.step_seconds, figures.scheduler_seconds)
        self.metrics.set_queue_sizes(figures.num_running, figures.num_waiting)
        self.metrics.set_tier_bytes(figures.tier_used_bytes, figures.tier_capacity_bytes)
        self.metrics.set_tier_cached_tokens(figures.tier_cached_tokens)
        self.metrics.set_cache_totals(
            figures.cache_counters, figures.disk_page_errors, figures.remote_page_errors
        )
        self.metrics.set_hit_tokens(self.hit_tokens)
        if figures.retention is not None:  # the retained prompts' pages and releases
            for tier, pages in figures.retention.pages_by_tier.items():
                self.metrics.retained_pages.set(pages, tier=tier.label)
            self.metrics.retention_evicted.set_total(figures.retention.evicted_total)

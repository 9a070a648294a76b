"""Every `tieredkv_*` Prometheus metric of the public contract (docs/operations.md, "Metrics").

`EngineMetrics` owns the registry: events are recorded by `on_<event>` methods, gauges and
totals mirrored from the cache by `set_<figure>` methods (each a few locked additions), and the
server calls `render()` for `GET /metrics`. The metric objects are public attributes too, for
reading a series. What the engine reports to them, and when, is `engine_recorder`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.metrics import EVICTION_ACTIONS, CacheCounters
from tieredkv.cache.sliding_pages import LAYER_KIND_LABELS
from tieredkv.cache.tier import Tier
from tieredkv.engine.protocol import FinishReason
from tieredkv.prometheus_format import Counter, Gauge, Histogram, Registry

PREFIX = "tieredkv_"
TIER_LABELS = tuple(tier.label for tier in Tier)  # ("device", "host", "disk", "remote")
PROMOTION_SOURCES = ("host", "disk", "remote")
SUCCESS_REASONS = ("stop", "length", "abort")
REMOTE_ERROR_REASONS = ("corrupt", "fingerprint", "mac", "key", "unavailable")

# 1 ms × 2^k up to 16 s (the last bound is 2^14 ms = 16.384 s)
PROMOTION_BUCKETS = tuple(0.001 * 2**k for k in range(15))
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class EngineMetrics:
    """The contract's metrics, registered in contract order, every known series present at 0."""

    def __init__(self) -> None:
        self.registry = Registry()
        tiers = [(t,) for t in TIER_LABELS]
        pairs = [(a, b) for a in TIER_LABELS for b in TIER_LABELS if a != b]
        self.prompt_tokens = self._counter("prompt_tokens_total", "Prompt tokens received.")
        self.generation_tokens = self._counter("generation_tokens_total", "Tokens generated.")
        self.cache_hit_tokens = self._counter(
            "cache_hit_tokens_total",
            "Prompt tokens reused from the cache, by the tier they were served or promoted from.",
            ("tier",),
            tiers,
        )
        self.promotion_seconds = self._histogram(
            "promotion_seconds",
            "Per request and source tier: admission until its promoted pages are ready.",
            PROMOTION_BUCKETS,
            ("from_tier",),
            [(t,) for t in PROMOTION_SOURCES],
        )
        self.transfer_bytes = self._counter(
            "transfer_bytes_total",
            "Bytes copied between tiers, write-through included.",
            ("from_tier", "to_tier"),
            pairs,
        )
        self.tier_used_bytes = self._gauge(
            "tier_used_bytes",
            "Bytes allocated in a tier, in-flight destinations included.",
            ("tier",),
            tiers,
        )
        self.tier_capacity_bytes = self._gauge(
            "tier_capacity_bytes",
            "Capacity of a tier in bytes (0 when disabled).",
            ("tier",),
            tiers,
        )
        self.evicted_pages = self._counter(
            "evicted_pages_total",
            "Pages evicted from a tier: demoted iff a copy remains in a lower tier, else dropped.",
            ("tier", "action"),
            [(t, a) for t in TIER_LABELS for a in EVICTION_ACTIONS],
        )
        self.disk_page_errors = self._counter(
            "disk_page_errors_total",
            "Disk records or files refused, by reason.",
            ("reason",),
            [(r.label,) for r in DiskErrorReason],
        )
        self.time_to_first_token = self._histogram(
            "time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS
        )
        self.time_per_output_token = self._histogram(
            "time_per_output_token_seconds",
            "Mean time between output tokens of a request, after the first.",
            TPOT_BUCKETS,
        )
        self.e2e_request_latency = self._histogram(
            "e2e_request_latency_seconds", "Arrival to the final output.", E2E_BUCKETS
        )
        self.queue_seconds = self._histogram(
            "queue_seconds", "Arrival to first forward.", QUEUE_BUCKETS
        )
        self.requests_running = self._gauge("requests_running", "Requests in the running batch.")
        self.requests_waiting = self._gauge("requests_waiting", "Requests waiting in the queue.")
        self.request_success = self._counter(
            "request_success_total",
            "Finished requests by finish reason.",
            ("finished_reason",),
            [(r,) for r in SUCCESS_REASONS],
        )
        self.preemptions = self._counter("preemptions_total", "Running requests preempted.")
        # extensions beyond the contract (docs/operations.md, "Metrics")
        self.deferred_admissions = self._counter(
            "deferred_admissions_total",
            "Requests that waited for a running request computing a prefix they share (lpm).",
        )
        self.remote_page_errors = self._counter(
            "remote_page_errors_total",
            "Remote values refused (corrupt, fingerprint, key) and remote calls that failed or "
            "ran past their budget (unavailable): each a miss, never served.",
            ("reason",),
            [(reason,) for reason in REMOTE_ERROR_REASONS],
        )
        self.prefill_tokens = self._counter(
            "prefill_tokens_total",
            "Prompt tokens the model computed (the rest of the prompts came from the cache, or "
            "from the sequence a fork shares its prompt with).",
        )
        self.step_seconds = self._counter(
            "step_seconds_total", "Seconds in engine steps that had work (forward included)."
        )
        self.scheduler_seconds = self._counter(
            "scheduler_seconds_total",
            "Seconds of those steps in the scheduler and cache bookkeeping: transfers applied, "
            "queue order, admission, page reservation, computed pages inserted.",
        )
        self.kv_events_published = self._counter(
            "kv_events_published_total", "KV events sent on --kv-events-endpoint, in batches."
        )
        self.kv_events_dropped = self._counter(
            "kv_events_dropped_total", "KV events lost unsent: the publisher's queue was full."
        )
        self.retained_pages = self._gauge(
            "retained_pages",
            'Pages of prompts retained 24 h ("24h"), per tier with a copy.',
            ("tier",),
            tiers,
        )
        self.retention_evicted = self._counter(
            "retention_evicted_total", "Retained prompts released by --retention-budget, LRU first."
        )
        self.tier_cached_tokens = self._gauge(
            "tier_cached_tokens",
            "Tokens of KV a tier holds per layer kind: full, its allocated pages; sliding, the "
            "sliding parts among them (0 for a model without sliding-window layers).",
            ("tier", "layer_kind"),
            [(t, kind) for t in TIER_LABELS for kind in LAYER_KIND_LABELS],
        )

    # -- events ------------------------------------------------------------------------------------

    def on_request_arrived(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)

    def on_first_forward(self, queue_seconds: float) -> None:
        self.queue_seconds.observe(queue_seconds)

    def on_promotion(self, from_tier: Tier, seconds: float) -> None:
        """One observation per request per source tier (host, disk or remote)."""
        self.promotion_seconds.observe(seconds, from_tier=from_tier.label)

    def on_prefill(self, num_tokens: int) -> None:
        """Prompt tokens forwarded in a step."""
        self.prefill_tokens.inc(num_tokens)

    def on_tokens_generated(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_first_token(self, ttft_seconds: float) -> None:
        self.time_to_first_token.observe(ttft_seconds)

    def on_preemption(self, num_requests: int = 1) -> None:
        self.preemptions.inc(num_requests)

    def on_deferred_admission(self) -> None:
        self.deferred_admissions.inc()

    def on_step(self, step_seconds: float, scheduler_seconds: float) -> None:
        self.step_seconds.inc(step_seconds)
        self.scheduler_seconds.inc(scheduler_seconds)

    def on_request_finished(
        self,
        reason: FinishReason,
        e2e_seconds: float,
        num_output_tokens: int,
        ttft_seconds: float | None,
    ) -> None:
        """End-to-end latency, mean time per output token (needs two or more tokens and a first
        token time) and the finish count. ERROR is not a success and is not counted there."""
        self.e2e_request_latency.observe(e2e_seconds)
        if ttft_seconds is not None and num_output_tokens > 1:
            decode_seconds = max(0.0, e2e_seconds - ttft_seconds)
            self.time_per_output_token.observe(decode_seconds / (num_output_tokens - 1))
        if reason is not FinishReason.ERROR:
            self.request_success.inc(finished_reason=reason.value)

    # -- gauges and totals kept elsewhere ----------------------------------------------------------

    def set_queue_sizes(self, num_running: int, num_waiting: int) -> None:
        self.requests_running.set(num_running)
        self.requests_waiting.set(num_waiting)

    def set_tier_bytes(
        self, used_bytes: Mapping[Tier, int], capacity_bytes: Mapping[Tier, int]
    ) -> None:
        for tier in Tier:
            self.tier_used_bytes.set(used_bytes.get(tier, 0), tier=tier.label)
            self.tier_capacity_bytes.set(capacity_bytes.get(tier, 0), tier=tier.label)

    def set_tier_cached_tokens(self, tokens: Mapping[str, Mapping[Tier, int]]) -> None:
        """Each tier's tokens of KV by layer kind (`sliding_pages.tokens_by_layer_kind`)."""
        for kind, by_tier in tokens.items():
            for tier, num_tokens in by_tier.items():
                self.tier_cached_tokens.set(num_tokens, tier=tier.label, layer_kind=kind)

    def set_cache_totals(
        self,
        counters: CacheCounters,
        disk_page_errors: Mapping[DiskErrorReason, int],
        remote_page_errors: Mapping[str, int],
    ) -> None:
        """Mirror the cache's own monotonic counters (once per step, on the engine thread:
        `cache.counters`, `cache.disk_page_errors()`, `cache.remote_page_errors()`); not its
        hit tokens, which count a preempted request's re-admission again (`set_hit_tokens`)."""
        for (src, dst), num_bytes in counters.transfer_bytes.items():
            self.transfer_bytes.set_total(num_bytes, from_tier=src.label, to_tier=dst.label)
        for (tier, action), pages in counters.evicted_pages.items():
            self.evicted_pages.set_total(pages, tier=tier.label, action=action)
        for reason, count in disk_page_errors.items():
            self.disk_page_errors.set_total(count, reason=reason.label)
        for remote_reason, count in remote_page_errors.items():
            self.remote_page_errors.set_total(count, reason=remote_reason)

    def set_hit_tokens(self, hit_tokens: Mapping[Tier, int]) -> None:
        """Prompt tokens reused, by tier, as requests report them at their first admission."""
        for tier, tokens in hit_tokens.items():
            self.cache_hit_tokens.set_total(tokens, tier=tier.label)

    # -- called by the server ----------------------------------------------------------------------

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every metric."""
        return self.registry.render()

    # -- declaration helpers -----------------------------------------------------------------------

    def _counter(
        self,
        name: str,
        help_text: str,
        label_names: tuple[str, ...] = (),
        label_values: list[tuple[str, ...]] | None = None,
    ) -> Counter:
        metric = Counter(PREFIX + name, help_text, label_names, label_values or ())
        self.registry.register(metric)
        return metric

    def _gauge(
        self,
        name: str,
        help_text: str,
        label_names: tuple[str, ...] = (),
        label_values: list[tuple[str, ...]] | None = None,
    ) -> Gauge:
        metric = Gauge(PREFIX + name, help_text, label_names, label_values or ())
        self.registry.register(metric)
        return metric

    def _histogram(
        self,
        name: str,
        help_text: str,
        buckets: tuple[float, ...],
        label_names: tuple[str, ...] = (),
        label_values: list[tuple[str, ...]] | None = None,
    ) -> Histogram:
        metric = Histogram(PREFIX + name, help_text, buckets, label_names, label_values or ())
        self.registry.register(metric)
        return metric

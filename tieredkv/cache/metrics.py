"""The cache's counters: the tree's tiers (`CacheCounters`) and the remote store's
(`RemoteCounters`, kept behind a lock by `CounterBox`).

Every event is recorded by an `on_<event>` method; `CounterBox.snapshot()` reads the remote
totals. The engine's metrics mirror them (docs/operations.md, "Metrics"):
  transfer_bytes   transfer_bytes_total{from_tier,to_tier} (write-through included)
  evicted_pages    evicted_pages_total{tier,action}: "demoted" iff a copy remains lower
  refused, errors  remote_page_errors_total{reason} (through `TieredCache.remote_page_errors()`)
Disk page errors come from the store (`TieredCache.disk_page_errors()`), used and capacity
bytes from the pools (`TieredCache.tier_used_bytes()` / `tier_capacity_bytes()`).
`hit_tokens` counts every promotion, a preempted request's re-admission included; the engine
exports what requests report at their first admission instead (`cache_hit_tokens_total`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tieredkv.cache.tier import Tier

EVICTION_ACTIONS = ("demoted", "dropped")


def _per_tier() -> dict[Tier, int]:
    return dict.fromkeys(Tier, 0)


def _per_pair() -> dict[tuple[Tier, Tier], int]:
    return {(a, b): 0 for a in Tier for b in Tier if a != b}


def _per_eviction() -> dict[tuple[Tier, str], int]:
    return {(tier, action): 0 for tier in Tier for action in EVICTION_ACTIONS}


@dataclass
class CacheCounters:
    """Monotonic counters, updated on the engine thread only; keys are always all present (zero
    when a tier is unused)."""

    hit_tokens: dict[Tier, int] = field(default_factory=_per_tier)
    transfer_bytes: dict[tuple[Tier, Tier], int] = field(default_factory=_per_pair)
    evicted_pages: dict[tuple[Tier, str], int] = field(default_factory=_per_eviction)

    def on_hit(self, tier: Tier, num_tokens: int) -> None:
        """Tokens of a match made ready on the device from `tier`."""
        self.hit_tokens[tier] += num_tokens

    def on_transfer(self, src: Tier, dst: Tier, num_bytes: int) -> None:
        self.transfer_bytes[src, dst] += num_bytes

    def on_eviction(self, tier: Tier, num_pages: int, demoted: bool) -> None:
        self.evicted_pages[tier, "demoted" if demoted else "dropped"] += num_pages


@dataclass
class RemoteCounters:
    """Totals since the store opened (a snapshot when returned by `RemoteStore.counters`)."""

    lookups: int = 0  # lookup calls
    hits: int = 0  # pages fetched and verified
    misses: int = 0  # pages asked for and not served: gone, refused, or the call failed
    refused: dict[str, int] = field(default_factory=dict)  # by refusal reason, every one present
    writes: int = 0  # pages SET
    dedup_skips: int = 0  # pages not written because the store already held them
    dropped_writes: int = 0  # pages not written: queue full, store degraded or a write failed
    errors: int = 0  # calls or write batches that failed or ran out of time
    bytes_in: int = 0  # value bytes read from the store
    bytes_out: int = 0  # value bytes written to the store
    expiries_set: int = 0  # retained pages given (or refreshed) their expiry in the store


class CounterBox:
    """RemoteCounters behind a lock: the caller's thread, the store's call thread and its
    writer thread all record."""

    def __init__(self, refusal_reasons: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._counters = RemoteCounters(refused=dict.fromkeys(refusal_reasons, 0))

    def on_lookup(self) -> None:
        self._add(lookups=1)

    def on_fetch(self, num_hits: int, num_misses: int) -> None:
        self._add(hits=num_hits, misses=num_misses)

    def on_bytes_read(self, num_bytes: int) -> None:
        self._add(bytes_in=num_bytes)

    def on_refused(self, reason: str) -> None:
        with self._lock:
            self._counters.refused[reason] += 1

    def on_call_failed(self) -> None:
        """A call that failed or ran past its budget."""
        self._add(errors=1)

    def on_put(self, num_skipped: int, num_dropped: int) -> None:
        """Pages offered for writing and not queued: already written or queued, or no room."""
        self._add(dedup_skips=num_skipped, dropped_writes=num_dropped)

    def on_batch_failed(self, num_pages: int) -> None:
        """A write batch the connection failed: every page of it dropped."""
        self._add(errors=1, dropped_writes=num_pages)

    def on_batch_written(
        self, num_written: int, num_skipped: int, num_refused: int, num_bytes: int
    ) -> None:
        """A write batch done: pages SET, pages the store held already, pages it refused (one
        error for the batch) and the value bytes written."""
        self._add(
            writes=num_written,
            dedup_skips=num_skipped,
            dropped_writes=num_refused,
            errors=1 if num_refused else 0,
            bytes_out=num_bytes,
        )

    def on_expiries_set(self, num_pages: int) -> None:
        """Retained pages whose expiry the store set: written with it, or PEXPIREd."""
        self._add(expiries_set=num_pages)

    def snapshot(self) -> RemoteCounters:
        with self._lock:
            return replace(self._counters, refused=dict(self._counters.refused))

    def _add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self._counters, name, getattr(self._counters, name) + amount)

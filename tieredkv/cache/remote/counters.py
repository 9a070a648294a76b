"""The remote store's counters, moved from the caller's thread and the store's own threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from tieredkv.cache.remote.record import RefusalReason


@dataclass
class RemoteCounters:
    """Totals since the store opened (a snapshot when returned by `RemoteStore.counters`)."""

    lookups: int = 0  # lookup calls
    hits: int = 0  # pages fetched and verified
    misses: int = 0  # pages asked for and not served: gone, refused, or the call failed
    refused: dict[str, int] = field(
        default_factory=lambda: {reason.value: 0 for reason in RefusalReason}
    )
    writes: int = 0  # pages SET
    dedup_skips: int = 0  # pages not written because the store already held them
    dropped_writes: int = 0  # pages not written: queue full, store degraded or a write failed
    errors: int = 0  # calls or write batches that failed or ran out of time
    bytes_in: int = 0  # value bytes read from the store
    bytes_out: int = 0  # value bytes written to the store


class CounterBox:
    """RemoteCounters behind a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = RemoteCounters()

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self._counters, name, getattr(self._counters, name) + amount)

    def refuse(self, reason: RefusalReason) -> None:
        with self._lock:
            self._counters.refused[reason.value] += 1

    def snapshot(self) -> RemoteCounters:
        with self._lock:
            return replace(self._counters, refused=dict(self._counters.refused))

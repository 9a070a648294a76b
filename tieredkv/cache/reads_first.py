"""Reads before writes on one store (the disk, the remote store): a read serves a request that
waits for it, a write is background work (write-through, a demotion). While any read is in
flight, each write chunk waits, at most `max_wait_s` (writes are never starved: a demotion may
be what frees room for a request).

Measured on session 11's machine: a 3k-token history read from disk right after another
request's 70.8 MB write-through took 180-480 ms to the first token; with the write done first,
150-260 ms (the read alone: ~50-80 ms). On session 12's, a replica's first lookup in Redis after
it computed a 3k-token prompt queued behind that prompt's 75 MB of writes, ran past its 20 ms
budget, and the turn was recomputed (2.5 s)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_WRITE_WAIT_S = 0.5  # per write chunk; a 32 MiB read takes ~20-40 ms here


class ReadsFirst:
    """Thread-safe: readers enter `reading()`, writers call `before_write()` per chunk."""

    def __init__(self, max_wait_s: float = MAX_WRITE_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._changed = threading.Condition()
        self._reads = 0
        self.writes_deferred = 0  # write chunks that waited for a read (tests, diagnostics)

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._changed:
            self._reads += 1
        try:
            yield
        finally:
            with self._changed:
                self._reads -= 1
                if not self._reads:
                    self._changed.notify_all()

    def before_write(self) -> None:
        """Return once no read is in flight, or after `max_wait_s`."""
        with self._changed:
            if self._reads:
                self.writes_deferred += 1
                self._changed.wait_for(lambda: not self._reads, timeout=self.max_wait_s)

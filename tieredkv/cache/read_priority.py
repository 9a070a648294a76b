"""`ReadPriority`: reads go before writes on one store (the disk, the remote store). A read
serves a request that waits for it, a write is background work (write-through, a demotion).
While any read is in flight, each write chunk waits, at most `max_wait_s` (writes are never
starved: a demotion may be what frees room for a request).

A write-through of one request's history is tens of MB; a read queued behind it on the same
device or connection waits for all of it, and the request waiting for that read waits too. On
Redis, which serves one command at a time, a lookup queued behind a prompt's writes runs past
its budget, the tier turns degraded and the turn is recomputed. Letting reads go first keeps a
request's read as fast as the store alone allows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_WRITE_WAIT_S = 0.5  # per write chunk: many times a 32 MiB read, so reads rarely run past it


class ReadPriority:
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

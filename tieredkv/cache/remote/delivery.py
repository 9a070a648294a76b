"""Handing a fetch's verified values to its sink, until the fetch is over.

A fetch runs on the store's call thread while the caller waits at most its budget; a fetch that
ran past it may still be reading when the caller has moved on, and the pages it was writing
into may belong to someone else by then. `Delivery` closes the door: once `close()` returns,
the sink is never called again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

PageSink = Callable[[int, memoryview], None]  # (index of the key, the value's verified bytes)


class Delivery:
    """Hands verified values to a fetch's sink until `close()`."""

    def __init__(self, sink: PageSink, count: int) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._open = True
        self.delivered = [False] * count

    def __call__(self, index: int, data: memoryview) -> bool:
        """Deliver value `index`; False once closed (the reader stops)."""
        with self._lock:
            if not self._open:
                return False
            self._sink(index, data)
            self.delivered[index] = True
            return True

    def close(self) -> list[bool]:
        with self._lock:
            self._open = False
            return list(self.delivered)

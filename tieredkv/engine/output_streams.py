"""Each request's stream of updates, from the step thread to the event loop that awaits it.

A stream is an asyncio queue owned by the loop that opened it; the step thread puts into it with
`call_soon_threadsafe`. An update for a request whose stream is closed (the client hung up) is
dropped.
"""

from __future__ import annotations

import asyncio
import threading

from tieredkv.engine.protocol import RequestOutput

StreamItem = RequestOutput | Exception  # an exception: refused, or the engine stopped


class OutputStreams:
    """The open streams by request id (thread-safe)."""

    def __init__(self) -> None:
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[StreamItem]]] = {}
        self._lock = threading.Lock()

    def open(self, request_id: str) -> asyncio.Queue[StreamItem]:
        """A stream for `request_id`, read on the running event loop."""
        stream: asyncio.Queue[StreamItem] = asyncio.Queue()
        with self._lock:
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
        return stream

    def close(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def deliver(self, request_id: str, item: StreamItem) -> None:
        """Put `item` into the request's stream, if it is open (any thread)."""
        with self._lock:
            target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)

    def fail_all(self, error: Exception) -> None:
        """End every open stream with `error`."""
        with self._lock:
            request_ids = list(self._streams)
        for request_id in request_ids:
            self.deliver(request_id, error)

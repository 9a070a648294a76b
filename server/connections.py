"""Connection limits: what keeps slow or stuck clients from holding the server's connections.

- At most `max_connections` open connections: one more is answered 503 and closed at once, so
  file descriptors stay bounded whatever clients do.
- A request's headers must arrive within `header_timeout_s` of its first byte (of the
  connection, for one that sends nothing): else 408 and the connection closes. Between
  requests uvicorn's keep-alive timeout applies. (The body's bound is `read_body`'s.)
- A connection whose reader takes nothing for `stall_timeout_s` while output waits for it is
  reset, measured by what its peer has acknowledged (`unacknowledged_output`), not by a
  blocked send: the response's iterator is closed (which aborts the request and frees its
  pages).
- A body that stops arriving is answered 408 (`request_body`), which also closes the
  connection (`errors.APIError.closes_connection`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

from uvicorn.protocols.http.h11_impl import H11Protocol

from .unacknowledged_output import CountingTransport, StallWatch

log = logging.getLogger(__name__)


def _closing_response(status: str, text: str) -> bytes:
    """A whole HTTP/1.1 response that also closes the connection."""
    body = text.encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


_REFUSED = _closing_response("503 Service Unavailable", "too many open connections")
_HEADER_TIMEOUT = _closing_response("408 Request Timeout", "request headers not sent in time")


def guarded_protocol(
    max_connections: int, header_timeout_s: float, stall_timeout_s: float
) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection limit, the header timeout and the stall
    watch."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _stall_watch: StallWatch | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            counting = CountingTransport(transport)
            super().connection_made(counting)  # type: ignore[arg-type]
            if len(self.connections) > max_connections:
                log.warning("refusing a connection: %d are open", max_connections)
                transport.write(_REFUSED)
                transport.close()
                return
            self._arm_header_timer()
            self._stall_watch = StallWatch(
                counting, self.loop, stall_timeout_s, self._reader_stalled
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            if self._stall_watch is not None:
                self._stall_watch.stop()
            super().connection_lost(exc)

        def _reader_stalled(self, unacknowledged_bytes: int) -> None:
            log.info(
                "dropped a connection whose reader took nothing for %.0f s "
                "(%d bytes unacknowledged)",
                stall_timeout_s,
                unacknowledged_bytes,
            )
            sock = self.transport.get_extra_info("socket")
            if sock is not None:  # reset: the kernel drops the queued output at once
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and not self._in_request():
                self._arm_header_timer()  # the first bytes of the next request
            super().data_received(data)
            if self._in_request():
                self._disarm_header_timer()  # its headers are in

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._in_request() or self.transport.is_closing():
                return
            log.info(
                "closing a connection whose request headers took over %.0f s", header_timeout_s
            )
            self.transport.write(_HEADER_TIMEOUT)
            self.transport.close()

    return GuardedH11Protocol

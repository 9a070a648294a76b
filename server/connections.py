"""Connection limits: what keeps slow or stuck clients from holding the server's connections.

- At most `max_connections` open connections: one more is answered 503 and closed at once, so
  file descriptors stay bounded whatever clients do.
- A request's headers must arrive within `header_timeout_s` of its first byte (of the
  connection, for one that sends nothing): else 408 and the connection closes. Between
  requests uvicorn's keep-alive timeout applies. (The body's bound is `read_body`'s.)
- A response whose reader takes no data for `stall_timeout_s` is dropped: the send fails, the
  response's iterator is closed (which aborts the request and frees its pages) and the
  connection closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def _closing_response(status: str, text: str) -> bytes:
    """A whole HTTP/1.1 response that also closes the connection."""
    body = text.encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


_REFUSED = _closing_response("503 Service Unavailable", "too many open connections")
_HEADER_TIMEOUT = _closing_response("408 Request Timeout", "request headers not sent in time")


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection limit and the header timeout."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log.warning("refusing a connection: %d are open", max_connections)
                transport.write(_REFUSED)
                transport.close()
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

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


class SendStallLimit:
    """ASGI middleware: a send that waits over `seconds` for the client to take data (the
    transport's buffer stays full) ends the response; uvicorn then closes the connection."""

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stalled = False

        async def bounded_send(message: dict) -> None:
            nonlocal stalled
            try:
                with anyio.fail_after(self.seconds):
                    await send(message)
            except TimeoutError:
                stalled = True
                raise ClientStalled() from None

        try:
            await self.app(scope, receive, bounded_send)
        except BaseException:  # after a stall: ClientStalled, maybe inside an exception group
            if not stalled:
                raise
            log.info("dropped a response whose reader took nothing for %.0f s", self.seconds)


class ClientStalled(Exception):
    """The client stopped reading the response."""

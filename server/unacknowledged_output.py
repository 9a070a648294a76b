"""Unacknowledged output: what the server wrote to a connection that its peer has not yet
acknowledged, and the watch that drops a reader who takes nothing for `stall_timeout_s`.

A send blocks only once the kernel's send buffer (autotuned up to megabytes) and the
transport's buffer are full, so a blocked send says little about a reader: a stream of a few
thousand tokens fits in those buffers whole. What the peer's TCP stack has acknowledged does
say: the bytes written, less those still in the transport's buffer and in the kernel's send
queue (`SIOCOUTQ`: unsent plus sent but unacknowledged; Linux; where the kernel does not
answer, only the transport's buffer counts). While some output is unacknowledged and none
more of it has been acknowledged for `stall_timeout_s`, the watch reports a stall; the
connection's protocol then resets the connection, which ends its response and aborts the
request (`connections`).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # at most; a short stall limit is checked 4 times over its length
CHECKS_PER_LIMIT = 4


class CountingTransport:
    """A connection's transport that counts the bytes written through it; everything else is
    the transport's own (uvicorn writes every response through `write`)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.bytes_written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.bytes_written += len(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def kernel_unacknowledged_bytes(sock: Any) -> int:
    """Bytes in `sock`'s kernel send queue (unsent or unacknowledged); 0 where unknown."""
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # SIOCOUTQ for TCP
    except OSError:
        return 0
    return struct.unpack("i", raw)[0]


class StallWatch:
    """Checks a connection every `CHECK_INTERVAL_S` (or a quarter of the limit) until stopped;
    calls `on_stall` once, and stops, when its peer has acknowledged nothing for
    `stall_timeout_s` while output waited for it."""

    def __init__(
        self,
        transport: CountingTransport,
        loop: asyncio.AbstractEventLoop,
        stall_timeout_s: float,
        on_stall: Callable[[int], None],
    ) -> None:
        self._transport = transport
        self._sock = transport.get_extra_info("socket")
        self._loop = loop
        self._stall_timeout_s = stall_timeout_s
        self._interval_s = min(CHECK_INTERVAL_S, stall_timeout_s / CHECKS_PER_LIMIT)
        self._on_stall = on_stall
        self._acknowledged_bytes = 0
        self._progress_at = loop.time()
        self._timer: asyncio.TimerHandle | None = loop.call_later(self._interval_s, self._check)

    def unacknowledged_bytes(self) -> int:
        buffered = self._transport.get_write_buffer_size()
        return buffered + kernel_unacknowledged_bytes(self._sock)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        unacknowledged = self.unacknowledged_bytes()
        acknowledged = self._transport.bytes_written - unacknowledged
        now = self._loop.time()
        if unacknowledged == 0 or acknowledged > self._acknowledged_bytes:
            self._acknowledged_bytes = acknowledged
            self._progress_at = now
        elif now - self._progress_at >= self._stall_timeout_s:
            self._on_stall(unacknowledged)
            return
        self._timer = self._loop.call_later(self._interval_s, self._check)

"""The replies to a pipeline of GETs, read off the connection's socket into one reused buffer.

redis-py with hiredis builds a Python `bytes` per value: each page's bytes would go from the
socket into hiredis's buffer, into a fresh `bytes` object, then into a transfer job's
staging, then into the pool. Fresh memory is slow on a VM that returns freed memory to its
host (every first touch is a page fault), and a replica promotes from Redis only now and
then, so most promotions would find their buffers cold. Here each value goes from the socket
into one buffer the store keeps (a page's record fits in the CPU's L2 cache), is verified there,
and is handed on to be copied into its destination page: no allocation per value, one copy out
of the socket.

Only what a GET answers is accepted: a bulk string (`$<length>`) or a nil (`$-1`, or RESP3's
`_`). Anything else (an error reply, a malformed header, a closed socket) raises
`UnexpectedReply` or `OSError`: the connection can no longer be trusted and is dropped.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

AHEAD_BYTES = 16 << 10  # read-ahead for reply headers; a value's body goes straight to its buffer
_MAX_HEADER = 512  # "$<length>\r\n" is far shorter; an error line may be longer


class UnexpectedReply(ConnectionError):
    """The server answered something a GET does not: the stream cannot be read on."""


class ReplyStream:
    """Reads RESP replies from a connected socket: header lines through a small read-ahead,
    bodies straight into the caller's buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ahead = bytearray(AHEAD_BYTES)
        self._start = 0
        self._end = 0
        self._crlf = memoryview(bytearray(2))

    def _fill(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._ahead):  # keep the partial line, drop what was read
            self._ahead[: self._end - self._start] = self._ahead[self._start : self._end]
            self._end -= self._start
            self._start = 0
        received = self._sock.recv_into(memoryview(self._ahead)[self._end :])
        if received == 0:
            raise UnexpectedReply("the server closed the connection mid-reply")
        self._end += received

    def line(self) -> bytes:
        """The next line, without its CRLF."""
        while True:
            at = self._ahead.find(b"\r\n", self._start, self._end)
            if at >= 0:
                line = bytes(self._ahead[self._start : at])
                self._start = at + 2
                return line
            if self._end - self._start > _MAX_HEADER:
                raise UnexpectedReply("a reply header with no end")
            self._fill()

    def read_into(self, out: memoryview) -> None:
        """Fill `out` completely with the next bytes of the stream."""
        have = min(self._end - self._start, len(out))
        out[:have] = self._ahead[self._start : self._start + have]
        self._start += have
        while have < len(out):
            received = self._sock.recv_into(out[have:])
            if received == 0:
                raise UnexpectedReply("the server closed the connection mid-value")
            have += received

    def end_of_value(self) -> None:
        """Read the CRLF that ends a bulk string."""
        self.read_into(self._crlf)
        if self._crlf != b"\r\n":
            raise UnexpectedReply("a value longer than its header said")

    def skip(self, count: int, scratch: memoryview) -> None:
        """Read and drop `count` bytes."""
        while count > 0:
            piece = scratch[: min(count, len(scratch))]
            self.read_into(piece)
            count -= len(piece)


def read_get_replies(
    stream: ReplyStream,
    count: int,
    buffer: bytearray,
    on_value: Callable[[int, memoryview | None], bool],
    first: int = 0,
) -> bool:
    """Read `count` GET replies; reply i goes to `on_value(first + i, value)` (None for a
    missing key) as a view of `buffer`, valid only during the call. A value longer than
    `buffer` cannot be a page's record: it is read, dropped and handed on empty (it fails
    verification). Stops early, leaving replies unread, when `on_value` returns False; returns
    whether every reply was read."""
    view = memoryview(buffer)
    for index in range(first, first + count):
        header = stream.line()
        if header in (b"$-1", b"_"):
            value: memoryview | None = None
        elif header[:1] == b"$" and header[1:].isdigit():
            length = int(header[1:])
            if length <= len(buffer):
                value = view[:length]
                stream.read_into(value)
            else:
                stream.skip(length, view)
                value = view[:0]
            stream.end_of_value()
        elif header[:1] == b"-":
            refusal = header[1:200].decode(errors="replace")
            raise UnexpectedReply(f"the server refused a GET: {refusal}")
        else:
            raise UnexpectedReply(f"not a GET's reply: {header[:40]!r}")
        if not on_value(index, value):
            return False
    return True

"""The GET-reply reader on its own, over a socket pair fed exact RESP bytes (the remote tier's
tests run it against real Redis): values, nils, replies split across any number of reads, an
error reply, a value too long for a page's record, a stop asked for, a connection closed
mid-value."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tieredkv.cache.remote.get_replies import ReplyStream, UnexpectedReply, read_get_replies


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)
    yield ours, theirs
    ours.close()
    theirs.close()


def send_in_pieces(sock: socket.socket, data: bytes, piece: int) -> threading.Thread:
    def send() -> None:
        for start in range(0, len(data), piece):
            sock.sendall(data[start : start + piece])

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def collect(stream: ReplyStream, count: int, buffer_bytes: int = 1 << 16) -> tuple[bool, list]:
    got: list = []

    def keep(index: int, value: memoryview | None) -> bool:
        got.append((index, None if value is None else bytes(value)))
        return True

    complete = read_get_replies(stream, count, bytearray(buffer_bytes), keep)
    return complete, got


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_values_and_nils_in_order_however_the_bytes_arrive(pair, piece: int) -> None:
    ours, theirs = pair
    values = [b"x" * 40_000, b"", b"\r\n$-1\r\n", bytes(range(256)) * 100]
    replies = bulk(values[0]) + b"$-1\r\n" + bulk(values[1]) + b"_\r\n"
    replies += bulk(values[2]) + bulk(values[3])
    sender = send_in_pieces(theirs, replies, piece)
    complete, got = collect(ReplyStream(ours), 6)
    sender.join()
    assert complete
    expected = [values[0], None, values[1], None, values[2], values[3]]
    assert got == list(enumerate(expected))


def test_the_stream_stays_in_step_across_calls(pair) -> None:
    """Two fetches on one connection: the read-ahead of the first keeps the second's bytes."""
    ours, theirs = pair
    theirs.sendall(bulk(b"a" * 10) + bulk(b"b" * 20))
    stream = ReplyStream(ours)
    assert collect(stream, 1) == (True, [(0, b"a" * 10)])
    assert collect(stream, 1) == (True, [(0, b"b" * 20)])


def test_an_error_reply_raises(pair) -> None:
    ours, theirs = pair
    theirs.sendall(bulk(b"ok") + b"-WRONGTYPE Operation against a key holding the wrong kind\r\n")
    with pytest.raises(UnexpectedReply, match="WRONGTYPE"):
        collect(ReplyStream(ours), 2)


def test_a_value_longer_than_the_buffer_is_handed_on_empty_and_skipped(pair) -> None:
    ours, theirs = pair
    sender = send_in_pieces(theirs, bulk(b"y" * 100_000) + bulk(b"z" * 10), 4096)
    complete, got = collect(ReplyStream(ours), 2, buffer_bytes=1000)
    sender.join()
    assert complete and got == [(0, b""), (1, b"z" * 10)]


def test_a_value_longer_than_its_header_said_raises(pair) -> None:
    ours, theirs = pair
    theirs.sendall(b"$3\r\nabcd\r\n")
    with pytest.raises(UnexpectedReply):
        collect(ReplyStream(ours), 1)


def test_a_stop_leaves_the_rest_unread(pair) -> None:
    ours, theirs = pair
    theirs.sendall(bulk(b"1") + bulk(b"2") + bulk(b"3"))
    seen: list[int] = []

    def stop_after_two(index: int, value: memoryview | None) -> bool:
        seen.append(index)
        return index < 1

    assert not read_get_replies(ReplyStream(ours), 3, bytearray(64), stop_after_two)
    assert seen == [0, 1]


@pytest.mark.parametrize("reply", [b"+OK\r\n", b":1\r\n", b"$abc\r\n", b"*2\r\n"])
def test_what_a_get_does_not_answer_raises(pair, reply: bytes) -> None:
    ours, theirs = pair
    theirs.sendall(reply)
    with pytest.raises(UnexpectedReply):
        collect(ReplyStream(ours), 1)


def test_a_connection_closed_mid_value_raises(pair) -> None:
    ours, theirs = pair
    theirs.sendall(b"$100\r\n" + b"q" * 50)
    theirs.close()
    with pytest.raises(UnexpectedReply, match="closed"):
        collect(ReplyStream(ours), 1)

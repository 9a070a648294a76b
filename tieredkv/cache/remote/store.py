"""`RemoteStore`: KV pages in Redis, found with one pipelined lookup, verified on every fetch.

Calls on the request path (`lookup`, `fetch_into`) run on the store's call thread while the caller
waits at most its budget (`RemoteTimeouts`); a failure or a late answer returns "nothing
found", counts an error and turns the store degraded. While degraded, calls return at once
without touching the network, and the writer thread reconnects with exponential backoff.
Nothing here raises on the network's account: a remote tier that fails costs hits, never a
request. Writes (`put`) and retained pages' expiries (`retain`) are queued and done by the
writer thread (see `writer`), and each of its batches waits while a lookup or a fetch is in
flight (`ReadPriority`): Redis serves one command at a time, and a request waits for the read,
not for the write.

A fetch from a single Redis reads the pipelined replies off redis-py's connection itself
(`get_replies`): each value lands in one buffer the store keeps, is verified there and handed to
the caller to copy into its page, instead of becoming a `bytes` object first. A cluster's
fetch goes through redis-py's cluster pipeline, which routes each key to its node.
"""

from __future__ import annotations

import dataclasses
import socket
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from tieredkv.cache.metrics import CounterBox, RemoteCounters
from tieredkv.cache.page_record import fingerprint_digest, lz4_block
from tieredkv.cache.read_priority import ReadPriority
from tieredkv.cache.remote.client import RemoteClient
from tieredkv.cache.remote.connection import RemoteTimeouts, check_url, connection_errors
from tieredkv.cache.remote.delivery import Delivery, PageSink
from tieredkv.cache.remote.get_replies import ReplyStream, read_get_replies
from tieredkv.cache.remote.keys import redis_key
from tieredkv.cache.remote.record import (
    COMPRESSIONS,
    RefusalReason,
    RemotePage,
    decode_value,
    max_value_bytes,
)
from tieredkv.cache.remote.secret import StoreKeys
from tieredkv.cache.remote.writer import RETAINED_KEYS, RemoteWriter
from tieredkv.errors import ConfigError

T = TypeVar("T")
# A fetch's GETs go out this many at a time, two windows in flight. Redis copies the replies to
# the commands of one read into its output buffers before it writes the first: a turn's whole
# history (tens of MB) in one pipeline makes the first reply wait until Redis has buffered all
# of it, in memory it may never have touched before. Small windows keep Redis's buffers small
# and the first page arriving at once, while the second window hides the round trip.
WINDOW_KEYS = 8
WINDOWS_IN_FLIGHT = 2


class RemoteStore:
    """The remote tier's store. `fingerprint` is the model fingerprint (as for the disk store);
    every page is `page_size` tokens and `page_bytes` bytes of KV. Pages are named and sealed
    with keys derived from the deployment's `secret` (`remote.secret`; None: the empty secret,
    no authenticity). Callers name pages by their page keys; the store names them in Redis by
    `StoreKeys.name`. Thread-safe."""

    def __init__(
        self,
        url: str,
        fingerprint: bytes,
        page_size: int,
        page_bytes: int,
        compression: str = "none",
        password: str | None = None,
        timeouts: RemoteTimeouts | None = None,
        max_pending_pages: int = 256,
        secret: bytes | None = None,
    ) -> None:
        check_url(url)
        if compression not in COMPRESSIONS:
            raise ConfigError(f"--remote-compression must be none or lz4, got {compression!r}")
        if compression == "lz4":
            lz4_block()  # fail at start, with the fix in the message, if the package is missing
        for name, value in (("page_size", page_size), ("page_bytes", page_bytes)):
            if value <= 0:
                raise ConfigError(f"remote store {name} must be > 0, got {value}")
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.timeouts = timeouts or RemoteTimeouts()
        self._keys = StoreKeys.derive(secret, fingerprint_digest(fingerprint))
        self._counters = CounterBox(reason.value for reason in RefusalReason)
        self._client = RemoteClient(url, password, self.timeouts)
        self.read_priority = ReadPriority()
        self._writer = RemoteWriter(
            self._client,
            self.read_priority,
            self._counters,
            self._keys,
            COMPRESSIONS[compression],
            self.timeouts,
            max_pending_pages * page_bytes,
        )
        self._value_buffer = bytearray(max_value_bytes(page_bytes))  # call thread's
        self._retained_names: OrderedDict[bytes, bytes] = OrderedDict()  # name -> page key
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tieredkv-remote")
        self._client.try_connect()  # at start-up; on failure the writer thread keeps trying
        self._writer.start()

    @property
    def healthy(self) -> bool:
        return self._client.healthy

    @property
    def degraded(self) -> bool:
        return not self._client.healthy

    @property
    def last_error(self) -> str:
        """Why the store last failed (for /health and logs)."""
        return self._client.last_error

    @property
    def memory_policy(self) -> str | None:
        """Redis's maxmemory-policy as read at the last connection (None: unknown)."""
        return self._client.memory_policy

    def wait_healthy(self, timeout_s: float) -> bool:
        return self._client.wait_healthy(timeout_s)

    def counters(self) -> RemoteCounters:
        return self._counters.snapshot()

    def key_name(self, key: bytes) -> str:
        """The Redis key the page of page key `key` is stored under."""
        return redis_key(self._keys.name(key))

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading `keys` the store holds: one pipelined EXISTS round trip (one per
        cluster node holding them). 0 when degraded, failed or over budget."""
        return self.lookup_also(keys, ())[0]

    def lookup_also(self, keys: Sequence[bytes], also: Sequence[bytes]) -> tuple[int, list[bool]]:
        """`lookup(keys)`, and in the same round trip whether the store holds each of `also`
        (all False when degraded, failed or over budget)."""
        self._counters.on_lookup()
        nothing = (0, [False] * len(also))
        if not keys:
            return nothing
        names = [self._keys.name(key) for key in keys]
        also_names = [self._keys.name(key) for key in also]
        return self._call(
            lambda client: self._leading(client, names, also_names),
            nothing,
            self.timeouts.lookup_s,
        )

    def fetch_into(
        self, keys: Sequence[bytes], sink: PageSink, sizes: Sequence[int] | None = None
    ) -> list[bool]:
        """Hand each key's page bytes (verified, `sizes[index]` long: page_bytes when not given)
        to `sink(index, data)`, in order, on the store's call thread; `data` is valid only
        during the call. Returns, per
        key, whether it was delivered: not when the store no longer holds it, refused it
        (counted by reason), or the call failed or ran over its budget before reaching it.
        Once this returns, `sink` is never called again."""
        if not keys:
            return []
        delivery = Delivery(sink, len(keys))
        keys = [self._keys.name(key) for key in keys]
        sizes = [self.page_bytes] * len(keys) if sizes is None else list(sizes)
        budget_s = self.timeouts.fetch_budget_s(sum(sizes))
        self._call(lambda client: self._get_into(client, keys, sizes, delivery), None, budget_s)
        delivered = delivery.close()
        found = sum(delivered)
        self._counters.on_fetch(found, len(keys) - found)
        return delivered

    def fetch(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Each key's page bytes, verified, or None (as `fetch_into`, copied out)."""
        pages: list[bytes | None] = [None] * len(keys)

        def keep(index: int, data: memoryview) -> None:
            pages[index] = bytes(data)

        self.fetch_into(keys, keep)
        return pages

    def put(self, pages: Sequence[RemotePage]) -> None:
        """Queue pages for the writer thread; returns at once. Pages the store is known to hold
        are skipped (counted as dedup skips). A value holds a page or a part of one: at most
        page_bytes (the reader names the size it expects)."""
        for page in pages:
            assert len(page.tokens) == self.page_size, (len(page.tokens), self.page_size)
            assert 0 < memoryview(page.data).nbytes <= self.page_bytes, (
                memoryview(page.data).nbytes,
                self.page_bytes,
            )
        name = self._keys.name
        self._writer.put(dataclasses.replace(page, key=name(page.key)) for page in pages)

    def discard(self, keys: Sequence[bytes]) -> None:
        """Queue the deletion of the values of `keys` (no reader needs them); returns at once."""
        self._writer.unlink([self._keys.name(key) for key in keys])

    def retain(self, keys: Sequence[bytes], ttl_s: float) -> None:
        """Queue an expiry `ttl_s` from now for the pages of `keys` (retained prompts'): set by
        the writer thread on those the store holds and on those written later; returns at
        once. Engine thread (as `take_lost`)."""
        names = [self._keys.name(key) for key in keys]
        for name, key in zip(names, keys, strict=True):
            self._retained_names[name] = key
            self._retained_names.move_to_end(name)
        while len(self._retained_names) > RETAINED_KEYS:
            self._retained_names.popitem(last=False)
        self._writer.retain(names, ttl_s)

    def take_lost(self) -> set[bytes]:
        """Retained pages' keys the store was found not to hold since the last call."""
        lost = self._writer.take_lost()
        return {self._retained_names[name] for name in lost if name in self._retained_names}

    def flush_writes(self, timeout_s: float) -> bool:
        """Wait until every queued page is written or dropped and every queued expiry set
        (tests, shutdown)."""
        return self._writer.flush(timeout_s)

    def close(self) -> None:
        """Stop the threads and close the client; queued writes not yet done are dropped."""
        self._writer.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def call(self, work: Callable[[Any], T], nothing: T) -> T:
        """`work(client)` for a small command (the flush generations), on the call thread
        within a lookup's budget; `nothing` when degraded, failed or over budget."""
        return self._call(work, nothing, self.timeouts.lookup_s)

    def _call(self, work: Callable[[Any], T], nothing: T, budget_s: float) -> T:
        client = self._client.redis
        if not self._client.healthy or client is None:
            return nothing
        try:
            with self.read_priority.reading():  # the writer's next batch waits for this call
                future = self._calls.submit(work, client)
                return future.result(timeout=budget_s)  # SYNC: bounded by the call's budget
        except FutureTimeout:
            future.cancel()
            self._counters.on_call_failed()
            self._client.mark_degraded(f"a call ran past its {budget_s * 1e3:.0f} ms budget")
        except connection_errors() as error:
            self._counters.on_call_failed()
            self._client.mark_degraded(error)
        return nothing

    def _leading(
        self, client: Any, keys: Sequence[bytes], also: Sequence[bytes]
    ) -> tuple[int, list[bool]]:
        pipe = client.pipeline(transaction=False)
        for key in (*keys, *also):
            pipe.exists(redis_key(key))
        found = pipe.execute()
        count = 0
        while count < len(keys) and found[count]:
            count += 1
        if count < len(keys):  # evicted (or never written): write it again when put
            self._writer.forget(keys[count : count + 1])
        return count, [bool(held) for held in found[len(keys) :]]

    def _get_into(
        self, client: Any, keys: Sequence[bytes], sizes: Sequence[int], delivery: Delivery
    ) -> None:
        """GET every key (stored names), pipelined a window at a time, verifying and delivering
        the values in order."""
        missing: list[bytes] = []
        received = 0

        def on_value(index: int, value: bytes | memoryview | None) -> bool:
            nonlocal received
            if value is None:
                missing.append(keys[index])
                return True
            received += len(value)
            data = self._verify(keys[index], value, sizes[index])
            return data is None or delivery(index, data)

        try:
            names = [redis_key(key) for key in keys]
            pool = getattr(client, "connection_pool", None)  # a cluster client has none
            if pool is None or not self._read_replies(pool, names, on_value):
                self._pipelined_gets(client, names, on_value)
        finally:
            self._counters.on_bytes_read(received)
            self._writer.forget(missing)  # evicted (or never written): write it again when put

    def _pipelined_gets(
        self, client: Any, names: list[str], on_value: Callable[[int, bytes | None], bool]
    ) -> None:
        """redis-py's pipelines (a cluster's routes each key to its node), a window at a time."""
        batch = WINDOW_KEYS * WINDOWS_IN_FLIGHT
        for start in range(0, len(names), batch):
            pipe = client.pipeline(transaction=False)
            for name in names[start : start + batch]:
                pipe.get(name)
            for index, value in enumerate(pipe.execute(), start):
                if not on_value(index, value):
                    return

    def _read_replies(
        self, pool: Any, names: list[str], on_value: Callable[[int, memoryview | None], bool]
    ) -> bool:
        """The pipeline on one of `pool`'s connections, its replies read off the socket here;
        False, having sent nothing, when the connection shows no socket to read."""
        connection = pool.get_connection()
        sock = getattr(connection, "_sock", None)  # redis-py's; connected by get_connection
        if not isinstance(sock, socket.socket):
            pool.release(connection)
            return False
        windows = [names[at : at + WINDOW_KEYS] for at in range(0, len(names), WINDOW_KEYS)]

        def send(window: int) -> None:
            commands = [("GET", name) for name in windows[window]]
            connection.send_packed_command(connection.pack_commands(commands), check_health=False)

        complete = False
        try:
            stream = ReplyStream(sock)
            for window in range(min(WINDOWS_IN_FLIGHT, len(windows))):
                send(window)
            for window, window_names in enumerate(windows):
                complete = read_get_replies(
                    stream, len(window_names), self._value_buffer, on_value, window * WINDOW_KEYS
                )
                if not complete:
                    break
                if window + WINDOWS_IN_FLIGHT < len(windows):
                    send(window + WINDOWS_IN_FLIGHT)
        finally:
            if not complete:  # replies left unread, or the stream broke: never reuse it
                connection.disconnect()
            pool.release(connection)
        return True

    def _verify(self, name: bytes, value: bytes | memoryview, size: int) -> memoryview | None:
        result = decode_value(value, name, self._keys, self.page_size, size)
        if result.refused is not None:
            self._counters.on_refused(result.refused.value)
        return result.data

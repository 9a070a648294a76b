"""`RemoteStore`: KV pages in Redis, found with one pipelined lookup, verified on every fetch.

Calls on the request path (`lookup`, `fetch`) run on the store's call thread while the caller
waits at most its budget (`RemoteTimeouts`); a failure or a late answer returns "nothing
found", counts an error and turns the store degraded. While degraded, calls return at once
without touching the network, and the writer thread reconnects with exponential backoff.
Nothing here raises on the network's account: a remote tier that fails costs hits, never a
request. Writes (`put`) are queued and done by the writer thread (see `writer`), and each of
its batches waits while a lookup or a fetch is in flight (`ReadsFirst`): Redis serves one
command at a time, and a request waits for the read, not for the write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from tieredkv.cache.disk.format import fingerprint_digest
from tieredkv.cache.reads_first import ReadsFirst
from tieredkv.cache.remote.connection import RemoteTimeouts, check_url, connection_errors
from tieredkv.cache.remote.counters import CounterBox, RemoteCounters
from tieredkv.cache.remote.keys import redis_key
from tieredkv.cache.remote.link import RemoteLink
from tieredkv.cache.remote.record import COMPRESSIONS, RemotePage, decode_value
from tieredkv.cache.remote.writer import RemoteWriter
from tieredkv.errors import ConfigError

T = TypeVar("T")


class RemoteStore:
    """The remote tier's store. `fingerprint` is the model fingerprint (as for the disk store);
    every page is `page_size` tokens and `page_bytes` bytes of KV. Thread-safe."""

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
    ) -> None:
        check_url(url)
        if compression not in COMPRESSIONS:
            raise ConfigError(f"--remote-compression must be none or lz4, got {compression!r}")
        for name, value in (("page_size", page_size), ("page_bytes", page_bytes)):
            if value <= 0:
                raise ConfigError(f"remote store {name} must be > 0, got {value}")
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.timeouts = timeouts or RemoteTimeouts()
        self._digest = fingerprint_digest(fingerprint)
        self._counters = CounterBox()
        self._link = RemoteLink(url, password, self.timeouts)
        self.reads_first = ReadsFirst()
        self._writer = RemoteWriter(
            self._link,
            self.reads_first,
            self._counters,
            self._digest,
            COMPRESSIONS[compression],
            self.timeouts,
            max_pending_pages,
        )
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tieredkv-remote")
        self._link.try_connect()  # at start-up; on failure the writer thread keeps trying
        self._writer.start()

    @property
    def healthy(self) -> bool:
        return self._link.healthy

    @property
    def degraded(self) -> bool:
        return not self._link.healthy

    @property
    def last_error(self) -> str:
        """Why the store last failed (for /health and logs)."""
        return self._link.last_error

    def wait_healthy(self, timeout_s: float) -> bool:
        return self._link.wait_healthy(timeout_s)

    def counters(self) -> RemoteCounters:
        return self._counters.snapshot()

    def lookup(self, keys: Sequence[bytes]) -> int:
        """How many leading `keys` the store holds: one pipelined EXISTS round trip (one per
        cluster node holding them). 0 when degraded, failed or over budget."""
        self._counters.add(lookups=1)
        if not keys:
            return 0
        return self._call(lambda client: self._leading(client, keys), 0, self.timeouts.lookup_s)

    def fetch(self, keys: Sequence[bytes]) -> list[memoryview | None]:
        """Each key's page bytes (page_bytes long), verified, or None when the store no longer
        holds it, refused it (counted by reason) or the call failed or ran over budget."""
        if not keys:
            return []
        budget_s = self.timeouts.fetch_budget_s(len(keys) * self.page_bytes)
        pages = self._call(lambda client: self._get(client, keys), [None] * len(keys), budget_s)
        found = sum(page is not None for page in pages)
        self._counters.add(hits=found, misses=len(keys) - found)
        return pages

    def put(self, pages: Sequence[RemotePage]) -> None:
        """Queue pages for the writer thread; returns at once. Pages the store is known to hold
        are skipped (counted as dedup skips)."""
        for page in pages:
            assert len(page.tokens) == self.page_size, (len(page.tokens), self.page_size)
            assert memoryview(page.data).nbytes == self.page_bytes, (
                memoryview(page.data).nbytes,
                self.page_bytes,
            )
        self._writer.put(pages)

    def flush_writes(self, timeout_s: float) -> bool:
        """Wait until every queued page is written or dropped (tests, shutdown)."""
        return self._writer.flush(timeout_s)

    def close(self) -> None:
        """Stop the threads and close the client; queued writes not yet done are dropped."""
        self._writer.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._link.close()

    def _call(self, work: Callable[[Any], T], nothing: T, budget_s: float) -> T:
        client = self._link.client
        if not self._link.healthy or client is None:
            return nothing
        try:
            with self.reads_first.reading():  # the writer's next batch waits for this call
                future = self._calls.submit(work, client)
                return future.result(timeout=budget_s)  # SYNC: bounded by the call's budget
        except FutureTimeout:
            future.cancel()
            self._counters.add(errors=1)
            self._link.mark_degraded(f"a call ran past its {budget_s * 1e3:.0f} ms budget")
        except connection_errors() as error:
            self._counters.add(errors=1)
            self._link.mark_degraded(error)
        return nothing

    def _leading(self, client: Any, keys: Sequence[bytes]) -> int:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(redis_key(key))
        found = pipe.execute()
        count = 0
        while count < len(keys) and found[count]:
            count += 1
        if count < len(keys):  # evicted (or never written): write it again when put
            self._writer.forget(keys[count : count + 1])
        return count

    def _get(self, client: Any, keys: Sequence[bytes]) -> list[memoryview | None]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(redis_key(key))
        values = pipe.execute()
        pages: list[memoryview | None] = []
        for key, value in zip(keys, values, strict=True):
            pages.append(None if value is None else self._verify(key, value))
        self._counters.add(bytes_in=sum(len(v) for v in values if v is not None))
        self._writer.forget(key for key, value in zip(keys, values, strict=True) if value is None)
        return pages

    def _verify(self, key: bytes, value: bytes) -> memoryview | None:
        result = decode_value(value, key, self._digest, self.page_size, self.page_bytes)
        if result.refused is not None:
            self._counters.refuse(result.refused)
        return result.data

"""The remote store's background thread: writes queued pages in batches, deduplicated, and
reconnects with exponential backoff while the store is degraded.

A batch is two pipelined round trips: EXISTS for every page, then SET NX for the missing ones
only, so a page already in the store (written by this replica or another) costs a few bytes,
not a page. Keys seen present are remembered (a bounded LRU set) and skipped at `put`.

Batches are small (`BATCH_PAGES`, ~3 MB of bf16 default-model KV) and each waits while this
replica has a lookup or a fetch in flight (`ReadPriority`): Redis runs one command at a time, so
a lookup sent behind a prompt's tens of MB of writes would wait for all of them and run past
its budget; this way it waits for one small batch at most.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable

from tieredkv.cache.metrics import CounterBox
from tieredkv.cache.read_priority import ReadPriority
from tieredkv.cache.remote.client import RemoteClient
from tieredkv.cache.remote.connection import RemoteTimeouts, connection_errors
from tieredkv.cache.remote.keys import redis_key
from tieredkv.cache.remote.record import RemotePage, encode_value
from tieredkv.cache.remote.secret import StoreKeys

log = logging.getLogger(__name__)

BATCH_PAGES = 8  # pages a batch: ~3 MB of bf16 default-model KV, ~3 ms of Redis's time


class RemoteWriter:
    """The queue of pages to write and the thread that drains it."""

    def __init__(
        self,
        client: RemoteClient,
        read_priority: ReadPriority,
        counters: CounterBox,
        store_keys: StoreKeys,
        codec: int,
        timeouts: RemoteTimeouts,
        max_pending_pages: int,
        batch_pages: int = BATCH_PAGES,
        known_keys: int = 1 << 16,
    ) -> None:
        self._client = client
        self._read_priority = read_priority
        self._counters = counters
        self._digest = store_keys
        self._codec = codec
        self._timeouts = timeouts
        self._max_pending = max_pending_pages
        self._batch_pages = batch_pages
        self._known: OrderedDict[bytes, None] = OrderedDict()  # keys the store holds, LRU
        self._known_limit = known_keys
        self._pending: deque[RemotePage] = deque()
        self._queued: set[bytes] = set()  # keys of pending and in-flight pages
        self._in_flight = 0
        self._stop = False
        self._cond = threading.Condition()
        client.on_degraded = self._wake
        self._thread = threading.Thread(
            target=self._run, name="tieredkv-remote-writer", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def put(self, pages: Iterable[RemotePage]) -> None:
        """Queue pages; never blocks on the network. Over the queue's bound, pages are dropped."""
        skipped = dropped = 0
        with self._cond:
            for page in pages:
                if page.key in self._known or page.key in self._queued:
                    skipped += 1
                elif len(self._pending) >= self._max_pending:
                    dropped += 1
                else:
                    self._pending.append(page)
                    self._queued.add(page.key)
            self._cond.notify_all()
        self._counters.on_put(skipped, dropped)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued page is written or dropped; False on timeout."""
        with self._cond:
            # SYNC: tests and shutdown wait for the queue to drain
            return self._cond.wait_for(lambda: not self._queued, timeout_s)

    def remember(self, keys: Iterable[bytes]) -> None:
        with self._cond:
            for key in keys:
                self._known[key] = None
                self._known.move_to_end(key)
            while len(self._known) > self._known_limit:
                self._known.popitem(last=False)

    def forget(self, keys: Iterable[bytes]) -> None:
        """Keys found absent (evicted by the store): write them again when put."""
        with self._cond:
            for key in keys:
                self._known.pop(key, None)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(self._timeouts.io_s + self._timeouts.connect_s + 1.0)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        backoff_s = self._timeouts.backoff_min_s
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._pending or not self._client.healthy)
                if self._stop:
                    return
            if not self._client.healthy:
                if self._client.try_connect():
                    backoff_s = self._timeouts.backoff_min_s
                    with self._cond:  # a restarted store may have lost every page
                        self._known.clear()
                    continue
                with self._cond:
                    self._cond.wait_for(lambda: self._stop, backoff_s)
                backoff_s = min(2 * backoff_s, self._timeouts.backoff_max_s)
                continue
            with self._cond:
                count = min(len(self._pending), self._batch_pages)
                batch = [self._pending.popleft() for _ in range(count)]
            self._write(batch)
            with self._cond:
                self._queued.difference_update(page.key for page in batch)
                self._cond.notify_all()

    def _write(self, batch: list[RemotePage]) -> None:
        names = [redis_key(page.key) for page in batch]
        try:
            client = self._client.redis
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            present = pipe.execute()
            missing = [i for i, found in enumerate(present) if not found]
            values = [encode_value(batch[i], self._digest, self._codec) for i in missing]
            self._read_priority.before_write()
            pipe = client.pipeline(transaction=False)
            for i, value in zip(missing, values, strict=True):
                pipe.set(names[i], value, nx=True)
            results = pipe.execute(raise_on_error=False) if missing else []
        except connection_errors() as error:
            self._counters.on_batch_failed(len(batch))
            self._client.mark_degraded(error)
            return
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:  # e.g. OOM under maxmemory with noeviction: the store is full, not down
            log.warning("remote store refused %d writes: %s", len(failed), failed[0])
        written = sum(r is True for r in results)
        nbytes = sum(len(v) for v, r in zip(values, results, strict=True) if r is True)
        skipped = len(batch) - len(missing) + sum(r is None for r in results)
        self._counters.on_batch_written(written, skipped, len(failed), nbytes)
        ok = [batch[i].key for i, found in enumerate(present) if found]
        stored = zip(missing, results, strict=True)
        ok += [batch[i].key for i, result in stored if not isinstance(result, Exception)]
        self.remember(ok)

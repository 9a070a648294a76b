"""The remote store's background thread: writes queued pages in batches, deduplicated, and
reconnects with exponential backoff while the store is degraded.

A batch is two pipelined round trips: EXISTS for every page, then SET NX for the missing ones
only, so a page already in the store (written by this replica or another) costs a few bytes,
not a page. Keys seen present are remembered (a bounded LRU set) and skipped at `put`.

Retained pages (`retain`) carry an expiry in the store: the writer sets it with pipelined
`PEXPIRE` on those the store holds, a retained page it writes goes with `SET NX PX`, and one it
finds already written (by any replica) gets its `PEXPIRE` in the same round trip as the batch's
`SET`s. Each key's expiry is remembered until it is due (a bounded map, the oldest first), so a
page retained now and written later still expires on time. Other pages carry no expiry: the
store's own eviction (`maxmemory-policy`) bounds them.

Batches are small (`BATCH_PAGES`, ~3 MB of bf16 default-model KV) and each waits while this
replica has a lookup or a fetch in flight (`ReadPriority`): Redis runs one command at a time, so
a lookup sent behind a prompt's tens of MB of writes would wait for all of them and run past
its budget; this way it waits for one small batch at most.
"""

from __future__ import annotations

import logging
import threading
import time
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
EXPIRY_BATCH_KEYS = 256  # PEXPIREs a round trip: a few bytes each
RETAINED_KEYS = 1 << 17  # retained keys remembered with their expiry (16 bytes and a float each)


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
        max_pending_bytes: int,
        batch_pages: int = BATCH_PAGES,
        known_keys: int = 1 << 16,
    ) -> None:
        self._client = client
        self._read_priority = read_priority
        self._counters = counters
        self._digest = store_keys
        self._codec = codec
        self._timeouts = timeouts
        self._max_pending_bytes = max_pending_bytes  # a page kept as parts: two smaller values
        self._pending_bytes = 0
        self._batch_pages = batch_pages
        self._known: OrderedDict[bytes, None] = OrderedDict()  # keys the store holds, LRU
        self._known_limit = known_keys
        self._pending: deque[RemotePage] = deque()
        self._queued: set[bytes] = set()  # keys of pending and in-flight pages
        # retained keys -> the monotonic time their expiry is due, soonest first; and the keys
        # whose expiry is still to be set in the store (in the order retained)
        self._expiry_at: OrderedDict[bytes, float] = OrderedDict()
        self._to_expire: dict[bytes, None] = {}
        self._expiring: set[bytes] = set()  # keys of the expiry batch in flight
        self._lost: set[bytes] = set()  # retained keys an expiry found absent, not queued
        self._to_unlink: list[bytes] = []  # keys of values no reader needs any more
        self._stop = False
        self._cond = threading.Condition()
        client.on_degraded = self._wake
        self._thread = threading.Thread(
            target=self._run, name="tieredkv-remote-writer", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def put(self, pages: Iterable[RemotePage]) -> None:
        """Queue pages; never blocks on the network. Over the queue's bound (bytes), pages are
        dropped.
        A page known written is skipped, unless its expiry is still to be set: the store may
        have lost it since."""
        skipped = dropped = 0
        with self._cond:
            for page in pages:
                expiry_due = page.key in self._to_expire or page.key in self._expiring
                known = page.key in self._known and not expiry_due
                if known or page.key in self._queued:
                    skipped += 1
                elif self._pending_bytes >= self._max_pending_bytes:
                    dropped += 1
                else:
                    self._pending.append(page)
                    self._pending_bytes += memoryview(page.data).nbytes
                    self._queued.add(page.key)
            self._cond.notify_all()
        self._counters.on_put(skipped, dropped)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued page is written or dropped and every queued expiry is set;
        False on timeout."""
        with self._cond:
            # SYNC: tests and shutdown wait for the queue to drain
            return self._cond.wait_for(self._idle, timeout_s)

    def retain(self, keys: Iterable[bytes], ttl_s: float) -> None:
        """Give the pages of `keys` an expiry `ttl_s` from now in the store, replacing any
        earlier one: set on those it holds, and on those written later. Never blocks on the
        network."""
        with self._cond:
            now = time.monotonic()
            for key in keys:
                self._expiry_at[key] = now + ttl_s
                self._expiry_at.move_to_end(key)
                self._to_expire[key] = None
            while self._expiry_at and (
                len(self._expiry_at) > RETAINED_KEYS or next(iter(self._expiry_at.values())) <= now
            ):
                self._expiry_at.popitem(last=False)  # due (or the oldest over the bound)
            while len(self._to_expire) > RETAINED_KEYS:  # a long outage: the oldest go
                del self._to_expire[next(iter(self._to_expire))]
            self._cond.notify_all()

    def take_lost(self) -> set[bytes]:
        """The retained keys found absent from the store when their expiry was set (evicted,
        or a restarted store) and not queued for writing since the last call."""
        with self._cond:
            lost, self._lost = self._lost, set()
        return lost

    def unlink(self, keys: Iterable[bytes]) -> None:
        """Delete the values of `keys` from the store (best effort: a value left behind costs
        memory until the store's own eviction takes it). Never blocks on the network."""
        with self._cond:
            for key in keys:
                self._known.pop(key, None)
                if len(self._to_unlink) < RETAINED_KEYS:
                    self._to_unlink.append(key)
            self._cond.notify_all()

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

    def _idle(self) -> bool:
        return not (self._queued or self._to_expire or self._expiring or self._to_unlink)

    def _expiries_ms(self, keys: Iterable[bytes]) -> list[int | None]:
        """Each key's expiry as milliseconds from now; None for a key not retained (or due)."""
        now = time.monotonic()
        with self._cond:
            due = [self._expiry_at.get(key) for key in keys]
        return [None if at is None or at <= now else max(1, int((at - now) * 1e3)) for at in due]

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        backoff_s = self._timeouts.backoff_min_s
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._stop
                        or self._pending
                        or self._to_expire
                        or self._to_unlink
                        or not self._client.healthy
                    )
                )
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
                self._pending_bytes -= sum(memoryview(page.data).nbytes for page in batch)
                expiring = [] if batch else list(self._to_expire)[:EXPIRY_BATCH_KEYS]
                for key in expiring:
                    del self._to_expire[key]
                self._expiring = set(expiring)
                unlinking = [] if batch or expiring else self._to_unlink[:EXPIRY_BATCH_KEYS]
                del self._to_unlink[: len(unlinking)]
            if batch:
                self._write(batch)
            elif expiring:
                self._set_expiries(expiring)
            else:
                self._unlink(unlinking)
            with self._cond:
                self._queued.difference_update(page.key for page in batch)
                self._expiring.clear()
                self._cond.notify_all()

    def _set_expiries(self, keys: list[bytes]) -> None:
        """PEXPIRE the retained keys the store holds; a key it does not hold is forgotten, to
        be written (with its expiry) when put again, and reported lost (`take_lost`)."""
        expiries = self._expiries_ms(keys)
        due = [(key, ms) for key, ms in zip(keys, expiries, strict=True) if ms is not None]
        try:
            pipe = self._client.redis.pipeline(transaction=False)
            for key, ms in due:
                pipe.pexpire(redis_key(key), ms)
            found = pipe.execute() if due else []
        except connection_errors() as error:
            with self._cond:  # set once the store is back
                self._to_expire.update(dict.fromkeys(keys))
            self._counters.on_batch_failed(0)
            self._client.mark_degraded(error)
            return
        absent = [key for (key, _), held in zip(due, found, strict=True) if not held]
        self.forget(absent)
        with self._cond:  # to be written again by whoever holds their pages
            if len(self._lost) < RETAINED_KEYS:
                self._lost.update(key for key in absent if key not in self._queued)
        self._counters.on_expiries_set(sum(bool(held) for held in found))

    def _unlink(self, keys: list[bytes]) -> None:
        try:
            pipe = self._client.redis.pipeline(transaction=False)
            for key in keys:
                pipe.unlink(redis_key(key))
            pipe.execute()
        except connection_errors() as error:  # left to the store's eviction
            self._counters.on_batch_failed(0)
            self._client.mark_degraded(error)

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
            expiries = self._expiries_ms(page.key for page in batch)
            held = [i for i, found in enumerate(present) if found and expiries[i] is not None]
            self._read_priority.before_write()
            pipe = client.pipeline(transaction=False)
            for i, value in zip(missing, values, strict=True):
                pipe.set(names[i], value, nx=True, px=expiries[i])
            for i in held:  # retained, written already (by any replica): its expiry now
                pipe.pexpire(names[i], expiries[i])
            replies = pipe.execute(raise_on_error=False) if missing or held else []
            results = replies[: len(missing)]
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
        outcome = dict(zip(missing, results, strict=True))
        retained = [i for i in missing if expiries[i] is not None]
        refreshed = sum(r is True for r in replies[len(missing) :])
        self._counters.on_expiries_set(sum(outcome[i] is True for i in retained) + refreshed)
        lost_race = [batch[i].key for i in retained if outcome[i] is None]
        if lost_race:  # another replica wrote it between EXISTS and SET: PEXPIRE it next
            with self._cond:
                self._to_expire.update(dict.fromkeys(lost_race))
        ok = [batch[i].key for i, found in enumerate(present) if found]
        ok += [batch[i].key for i, result in outcome.items() if not isinstance(result, Exception)]
        self.remember(ok)

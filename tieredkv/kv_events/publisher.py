"""`KvEventPublisher`: the cache's `PageListener` that publishes KV events over ZMQ as vLLM does.

The engine thread only appends an event to a bounded queue (`pages_stored`, `pages_removed`,
`all_cleared`); when `max_queue_events` wait already, the event is dropped and counted
(`dropped`), so a slow publisher never slows the engine. The publisher thread owns the sockets:
every `flush_interval_s` it takes what waits, in order, encodes it as `KVEventBatch`es of at most
MAX_BATCH_EVENTS events and sends each as three frames, (topic, 8-byte big-endian sequence
number, msgpack batch), on a PUB socket, which never blocks: a subscriber that does not keep up
loses messages past ZMQ's high-water mark and sees a gap in the sequence numbers. The last
`buffer_batches` batches are kept; a ROUTER at the replay endpoint answers a request
(identity, empty frame, 8-byte big-endian start sequence number) with every kept batch from
that number on, each as (identity, empty, topic, sequence, batch), and then an end marker
(identity, empty, empty topic, sequence -1, empty batch).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from tieredkv.cache.tier import Tier
from tieredkv.config import KvEventsConfig
from tieredkv.errors import ConfigError
from tieredkv.kv_events.schema import (
    MEDIUM_OF_TIER,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_hash,
)
from tieredkv.prometheus_format import Counter

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MAX_BATCH_EVENTS = 1024  # events per message: a large flush goes out as several
CLOSE_TIMEOUT_S = 2.0
DATA_PARALLEL_RANK = 0  # one engine per server

# (kind, tier, page keys, parent page's key, packed tokens) as the engine thread appends it
PendingEvent = tuple[type, Tier | None, tuple[bytes, ...], bytes | None, bytes]


class KvEventPublisher:
    """Publishes the cache's page events (see the module docstring); `close()` sends what waits
    and closes the sockets."""

    def __init__(self, config: KvEventsConfig, page_size: int) -> None:
        self.config = config
        self.page_size = page_size
        self._published: Counter | None = None  # events sent (`count_into`)
        self._dropped: Counter | None = None  # events not queued, the queue being full
        self.published = 0  # the same two counts, here whether or not metrics are kept
        self.dropped = 0
        self._pending: deque[PendingEvent] = deque()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_batches)
        self._next_seq = 0
        self._topic = config.topic.encode("utf-8")
        self._context = zmq.Context.instance()
        self._pub = self._socket(zmq.PUB, config.endpoint, bind=_binds(config.endpoint))
        self._replay = None
        if config.replay_endpoint is not None:
            try:
                self._replay = self._socket(zmq.ROUTER, config.replay_endpoint, bind=True)
            except ConfigError:
                self._pub.close()
                raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tkv-kv-events", daemon=True)
        self._thread.start()

    def count_into(self, published: Counter, dropped: Counter) -> None:
        """Count events sent and events dropped from now on in these metrics too."""
        self._published, self._dropped = published, dropped

    # --- the engine thread (`PageListener`) ------------------------------------------------

    def pages_stored(
        self, tier: Tier, keys: tuple[bytes, ...], parent_key: bytes | None, packed: bytes
    ) -> None:
        self._append((BlockStored, tier, keys, parent_key, packed))

    def pages_removed(self, tier: Tier, keys: tuple[bytes, ...]) -> None:
        self._append((BlockRemoved, tier, keys, None, b""))

    def all_cleared(self) -> None:
        self._append((AllBlocksCleared, None, (), None, b""))

    def _append(self, event: PendingEvent) -> None:
        if len(self._pending) >= self.config.max_queue_events:
            self.dropped += 1
            if self._dropped is not None:
                self._dropped.inc()
            return
        self._pending.append(event)

    def close(self) -> None:
        """Send what waits, stop the thread and close the sockets."""
        self._stop.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("the KV events thread did not stop within %.0f s", CLOSE_TIMEOUT_S)

    # --- the publisher thread --------------------------------------------------------------

    def _socket(self, kind: int, endpoint: str, bind: bool) -> zmq.Socket:
        sock = self._context.socket(kind)
        sock.set_hwm(self.config.hwm)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint) if bind else sock.connect(endpoint)
        except zmq.ZMQError as error:
            sock.close()
            raise ConfigError(f"KV events endpoint {endpoint}: {error}") from None
        return sock

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        interval_ms = self.config.flush_interval_s * 1000
        try:
            while True:
                stopping = self._stop.is_set()
                if self._replay is None:
                    self._stop.wait(self.config.flush_interval_s)
                elif poller.poll(interval_ms):
                    self._answer_replay()
                self._send_pending(encoder)
                if stopping:
                    break
        except Exception:
            logger.exception("the KV events thread stopped; no more events are published")
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _send_pending(self, encoder: msgspec.msgpack.Encoder) -> None:
        pending = self._pending
        while pending:
            count = min(len(pending), MAX_BATCH_EVENTS)
            events = [self._event(pending.popleft()) for _ in range(count)]
            batch = KVEventBatch(time.time(), events, DATA_PARALLEL_RANK)
            payload = encoder.encode(batch)
            seq = self._next_seq
            self._next_seq += 1
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self.published += count
            if self._published is not None:
                self._published.inc(count)

    def _event(self, pending: PendingEvent) -> Any:
        kind, tier, keys, parent_key, packed = pending
        if kind is AllBlocksCleared:
            return AllBlocksCleared()
        assert tier is not None
        hashes: list[int | bytes] = [block_hash(key) for key in keys]
        if kind is BlockRemoved:
            return BlockRemoved(block_hashes=hashes, medium=MEDIUM_OF_TIER[tier])
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=None if parent_key is None else block_hash(parent_key),
            token_ids=list(struct.unpack(f"<{len(packed) // 4}i", packed)),
            block_size=self.page_size,
            lora_id=None,
            medium=MEDIUM_OF_TIER[tier],
            lora_name=None,
        )

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("KV events replay: a request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


def _binds(endpoint: str) -> bool:
    """Bind a wildcard host and ipc/inproc endpoints; connect to a named host (as vLLM does)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))

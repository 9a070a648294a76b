"""vLLM's KV event structs (`vllm/distributed/kv_events.py`), declared here field for field so
the tests decode what tieredkv publishes the way vLLM's consumers do, not with its own schema;
and a subscriber that reads a publisher's stream as those consumers do (live messages, with a
replay of whatever it missed from the start)."""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

ExternalBlockHash = bytes | int
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)
Message = tuple[bytes, int, bytes]  # topic, sequence number, payload


class Subscriber:
    """A SUB socket on `endpoint` (and a DEALER on `replay_endpoint`), reading as a consumer."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: bytes = b"") -> None:
        context = zmq.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.messages: list[Message] = []

    def read_until_quiet(self, quiet_ms: int = 500) -> list[Message]:
        """Every message until none comes for `quiet_ms`; what was missed before the first one
        received is replayed, so the list starts at sequence number 0."""
        received: list[Message] = []
        while self.sub.poll(quiet_ms):
            topic, seq, payload = self.sub.recv_multipart()
            received.append((topic, int.from_bytes(seq, "big"), payload))
        first_live = received[0][1] if received else None
        if not self.messages and first_live != 0:  # subscribed late: the first ones went by
            missed = self.replay(0)
            received = [m for m in missed if first_live is None or m[1] < first_live] + received
        self.messages += received
        return received

    def replay(self, start_seq: int) -> list[Message]:
        """The publisher's kept messages from `start_seq` on, up to its end marker."""
        assert self.replay_endpoint is not None
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", start_seq.to_bytes(8, "big")))
            messages = []
            while True:
                assert dealer.poll(5000), "no answer to the replay request"
                _, topic, seq, payload = dealer.recv_multipart()
                if seq == END_SEQ:
                    return messages
                messages.append((topic, int.from_bytes(seq, "big"), payload))
        finally:
            dealer.close()

    def read_events(self) -> list[Any]:
        """The events of the messages `read_until_quiet` reads now."""
        received = self.read_until_quiet()
        return [e for _, _, payload in received for e in DECODER.decode(payload).events]

    def events(self) -> list[Any]:
        """The events of every message read, in order; sequence numbers have no gap."""
        seqs = [seq for _, seq, _ in self.messages]
        assert seqs == list(range(len(seqs))), seqs
        return [e for _, _, payload in self.messages for e in DECODER.decode(payload).events]

    def close(self) -> None:
        self.sub.close()


class ConsumerView:
    """Which block hashes a consumer believes are in each medium, from the events it applied."""

    def __init__(self) -> None:
        self.media: dict[str, set[int]] = {}
        self.known: set[int] = set()  # every hash stored so far, in any medium

    def apply(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                assert parent is None or parent in self.known, f"parent {parent} never stored"
                self.media.setdefault(event.medium, set()).update(event.block_hashes)
                self.known.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held = self.media.get(event.medium, set())
                assert set(event.block_hashes) <= held, "a block removed that was not stored"
                held.difference_update(event.block_hashes)
            else:
                self.media.clear()

    def held(self) -> dict[str, set[int]]:
        return {medium: hashes for medium, hashes in self.media.items() if hashes}

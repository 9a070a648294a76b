"""The wire format of KV events: vLLM's `vllm/distributed/kv_events.py` structs, field for field,
so its consumers (NVIDIA Dynamo's KV router, llm-d's KV-cache indexer) decode them unchanged.

A batch is a msgpack array `[ts, events, data_parallel_rank]`; each event is a msgpack map tagged
with its class name (`"type": "BlockStored"`). One page is one block: `block_hashes` are the
pages' keys as 64-bit ints (`block_hash`), `block_size` the page size in tokens, `medium` the
tier (`MEDIUM_OF_TIER`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from tieredkv.cache.tier import Tier

# The device tier is "GPU" whatever the device: consumers score a block by this name.
MEDIUM_OF_TIER = {Tier.DEVICE: "GPU", Tier.HOST: "CPU", Tier.DISK: "STORAGE"}
_HASH_MASK = (1 << 64) - 1


def block_hash(key: bytes) -> int:
    """A page key as the 64-bit int vLLM publishes for a block hash (its low 64 bits, read big
    endian, as vLLM converts its own hashes)."""
    return int.from_bytes(key, "big") & _HASH_MASK


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the tagged events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
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
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]

"""Drives a TieredCache with chat turns the way the engine does (engine/request_pages.py).

Per turn: pack the prompt (a request arrives as a new list of ints, as a tokenizer hands it
out; the engine packs it once, engine/request.py); match on arrival; match again at admission
and lock the matched path; allocate private device pages for the rest of the sequence; after
each prefill chunk insert the prompt's full pages (lock the new deepest node, unlock the old
one, free duplicates); append the output tokens one by one as decode would; at finish insert
prompt + output[:-1] (the last sampled token has no KV), free the private pages, unlock.

The packing, every match, insert, lock and unlock is timed alone (perf_counter_ns); slicing the
tokens and the page table and appending generated tokens happen outside the timed calls, as in
the engine. Match and insert take the packed tokens, as the engine passes them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.token_run import PackedTokens, TokenPacker
from tieredkv.cache.tiered_cache import TieredCache

from .radix_workload import ChatTurn

T = TypeVar("T")
Timer = Callable[..., Any]  # (samples, call, *args) -> call(*args)
PREFILL_CHUNK_TOKENS = 2048  # EngineConfig.max_batch_tokens: prefill inserts at chunk ends


@dataclass
class CallTimes:
    """Nanoseconds per call, by TieredCache method; `pack`: packing a prompt at arrival."""

    pack: list[int] = field(default_factory=list)
    match: list[int] = field(default_factory=list)
    insert: list[int] = field(default_factory=list)
    lock: list[int] = field(default_factory=list)
    unlock: list[int] = field(default_factory=list)

    def clear(self) -> None:
        for samples in (self.pack, self.match, self.insert, self.lock, self.unlock):
            samples.clear()


def fresh_tokens(tokens: list[int]) -> list[int]:
    """The same token ids as new int objects (a tokenizer's output for a new request)."""
    return np.asarray(tokens, dtype=np.int64).tolist()


def pack_prompt(ids: list[int]) -> TokenPacker:
    """A request's tokens at arrival: its prompt, packed once (engine/request.py does the same)."""
    packer = TokenPacker(ids)
    packer.packed()
    return packer


def timed(samples: list[int], call: Callable[..., T], *args: object) -> T:
    start = time.perf_counter_ns()
    result = call(*args)
    samples.append(time.perf_counter_ns() - start)
    return result


@dataclass
class _Request:
    tokens: PackedTokens
    page_table: list[int]
    tree_pages: int  # page_table[:tree_pages] belong to the tree, the rest are private
    locked: RadixNode | None


class ChatDriver:
    """Runs turns against `cache` (a device-only cache large enough for them: the benchmark
    times the tree, not eviction) in one namespace."""

    def __init__(self, cache: TieredCache, namespace: str = "default") -> None:
        self.cache = cache
        self.namespace = namespace
        self.page_size = cache.page_size
        self.times = CallTimes()
        self.timer: Timer = timed  # replaceable (radix_profile profiles the same calls)

    def run(self, turn: ChatTurn) -> None:
        cache, times, ps = self.cache, self.times, self.page_size
        packer = self.timer(times.pack, pack_prompt, fresh_tokens(turn.prompt))  # arrival
        prompt = packer.packed()
        self.timer(times.match, cache.match, prompt, self.namespace)  # on arrival
        match = self.timer(times.match, cache.match, prompt, self.namespace)  # admission
        assert match.num_pages == match.device.num_pages, "a device-only cache matched lower"
        if match.last_node is not None:
            self.timer(times.lock, cache.lock, match.last_node)
        request = _Request(prompt, list(match.device.pages), match.num_pages, match.last_node)
        num_tokens = len(turn.prompt) + len(turn.output) - 1  # what will have KV at finish
        needed = -(-num_tokens // ps) - len(request.page_table)
        pages = cache.allocate(needed)
        assert pages is not None, f"device too small for {needed} more pages"
        request.page_table.extend(pages)
        kv_len = match.matched_len
        while kv_len < len(prompt):  # prefill, chunk by chunk
            kv_len = min(kv_len + PREFILL_CHUNK_TOKENS, len(prompt))
            self._insert(request, kv_len)
        for token in fresh_tokens(turn.output[:-1]):  # decode: one token per step
            packer.append(token)
        request.tokens = packer.packed()
        self._insert(request, num_tokens)  # finish
        cache.free(request.page_table[request.tree_pages :])
        if request.locked is not None:
            self.timer(times.unlock, cache.unlock, request.locked)

    def _insert(self, request: _Request, kv_len: int) -> None:
        full_pages = kv_len // self.page_size
        if full_pages <= request.tree_pages:
            return
        tokens = request.tokens[: full_pages * self.page_size]
        table: Sequence[int] = request.page_table[:full_pages]
        # as the engine does: walk on from the node the request holds locked
        start = request.locked if request.tree_pages else None
        insert = functools.partial(
            self.cache.insert,
            start_node=start,
            start_pages=request.tree_pages if start is not None else 0,
        )
        result = self.timer(self.times.insert, insert, tokens, self.namespace, table)
        if result.node is not None and result.node is not request.locked:
            self.timer(self.times.lock, self.cache.lock, result.node)
            if request.locked is not None:
                self.timer(self.times.unlock, self.cache.unlock, request.locked)
            request.locked = result.node
        request.page_table[: result.num_pages] = result.device_pages
        request.tree_pages = result.num_pages
        if result.duplicate_pages:
            self.cache.free(result.duplicate_pages)

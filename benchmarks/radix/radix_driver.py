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
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.index.token_run import TokenPacker
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.engine.protocol import GenerationRequest
from tieredkv.engine.request import Request
from tieredkv.engine.request_pages import RequestPages
from tieredkv.model.sampler import SamplingParams

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


class ChatDriver:
    """Runs turns against `cache` (a device-only cache large enough for them: the benchmark
    times the tree, not eviction) in one namespace."""

    def __init__(self, cache: TieredCache, namespace: str = "default") -> None:
        self.cache = cache
        self.namespace = namespace
        self.pages = RequestPages(cache, cache.page_size, reuse_prefixes=True)
        self.times = CallTimes()
        self.timer: Timer = timed  # replaceable (radix_profile profiles the same calls)
        self._seq_ids = itertools.count()
        for name in ("match", "lock", "unlock"):
            setattr(cache, name, self._timed_method(name, getattr(cache, name)))
        # the facade's `insert` is the index's own method: timed there
        cache.index.insert = self._timed_method("insert", cache.index.insert)  # type: ignore[method-assign]

    def _timed_method(self, name: str, method: Callable[..., T]) -> Callable[..., T]:
        samples = getattr(self.times, name)

        @functools.wraps(method)
        def timed_method(*args: object, **kwargs: object) -> T:
            return self.timer(samples, functools.partial(method, **kwargs), *args)

        return timed_method

    def run(self, turn: ChatTurn) -> None:
        seq_id = next(self._seq_ids)
        spec = GenerationRequest(
            f"turn-{seq_id}", tuple(fresh_tokens(turn.prompt)), SamplingParams(), self.namespace
        )
        kv = CacheHandle(self.cache, self.namespace)
        # RequestPages never reads the output processor or the generator: no model needed
        request = self.timer(self.times.pack, Request, spec, seq_id, None, None, kv)
        pages = self.pages
        pages.on_arrival(request)
        assert pages.admit(request), "a device-only match is ready at admission"
        pages.take_promotion(request)
        prompt_len = len(turn.prompt)
        while request.kv_len < prompt_len:  # prefill, chunk by chunk
            end = min(request.kv_len + PREFILL_CHUNK_TOKENS, prompt_len)
            assert pages.grow(request, end), "device too small for one chunk"
            request.kv_len = end
            pages.insert_computed(request)
        request.output_ids.append(turn.output[0])  # sampled by the prefill's last step
        for token in fresh_tokens(turn.output[1:]):  # decode: one token per step
            assert pages.grow(request, request.kv_len + 1), "device too small to decode"
            request.kv_len += 1
            pages.insert_computed(request)
            request.output_ids.append(token)
        pages.release(request, keep_computed=True)

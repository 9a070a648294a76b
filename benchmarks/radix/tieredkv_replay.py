"""tieredkv's side of benchmarks/radix_vs_sglang.py: the trace through the engine's own
`RequestPages` (tieredkv/engine/request_pages.py), with `Request` objects holding a
`CacheHandle` and no model.

Per turn: arrival (match), admission (match, promote: a done ticket on a device-only cache,
lock), prefill in 2,048-token chunks (`grow`, then `insert_computed` after each chunk), decode
one token per step (`grow` as pages fill), and `release` at finish (insert prompt +
output[:-1], free, unlock). The engine also inserts a page as each fills during decode; SGLang
does not, so this replay inserts only after prefill chunks and at finish, as SGLang's does.
Timed: `TieredCache.match` and `TieredCache.insert` (wrapped on the instance, which the handle
calls), and `Demoter.make_room` when the device is short (the eviction inside `allocate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tieredkv.cache.build import build_cache
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.engine.protocol import GenerationRequest
from tieredkv.engine.request import Request
from tieredkv.engine.request_pages import RequestPages
from tieredkv.model.sampler import SamplingParams

from .no_transfers import NoTransferExecutor
from .replay_trace import CHUNK_TOKENS, OPS, PAGE_SIZE, Samples, Turn


def _timed(samples: list[int], call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        result = call(*args, **kwargs)
        samples.append(time.perf_counter_ns() - start)
        return result

    return wrapper


class TieredkvReplay:
    """A device-only TieredCache of `num_pages` pages driven through `RequestPages`."""

    def __init__(self, num_pages: int) -> None:
        layout = PageLayout(1, 1, 1, PAGE_SIZE, torch.float32)  # the tree's cost, not the bytes
        config = CacheConfig(
            page_size=PAGE_SIZE,
            device_cache_bytes=num_pages * layout.page_bytes,
            host_cache_bytes=0,
            write_policy=WritePolicy.WRITE_BACK,
        )
        executor = NoTransferExecutor()  # nothing moves between tiers: no threads
        self.cache = build_cache(
            config, layout, b"radix-vs-sglang", memory_executor=executor, disk_executor=executor
        )
        self.pages = RequestPages(self.cache, PAGE_SIZE, reuse_prefixes=True)
        self.samples: Samples = {op: [] for op in OPS}
        self.hit_tokens = 0
        self.evicted_pages = 0
        cache = self.cache
        cache.match = _timed(self.samples["match"], cache.match)  # type: ignore[method-assign]
        index = cache.index  # the facade's `insert` is the index's own method: timed there
        index.insert = _timed(self.samples["insert"], index.insert)  # type: ignore[method-assign]
        make_room = _timed(self.samples["evict"], cache.demoter.make_room)
        plain_make_room = cache.demoter.make_room

        def evict_when_short(tier: Tier, count: int) -> bool:
            short = cache.pools.num_free(tier) < count
            if not short:
                return plain_make_room(tier, count)
            before = cache.pools.num_free(tier)
            done = make_room(tier, count)
            self.evicted_pages += cache.pools.num_free(tier) - before
            return done

        cache.demoter.make_room = evict_when_short  # type: ignore[method-assign]

    def run(self, turn: Turn, seq_id: int) -> None:
        spec = GenerationRequest(f"r{seq_id}", tuple(turn.prompt), SamplingParams())
        kv = CacheHandle(self.cache, spec.namespace)
        # RequestPages never reads the output processor or the generator: no model needed
        request = Request(spec, seq_id, output=None, generator=None, kv=kv)  # type: ignore[arg-type]
        pages = self.pages
        pages.on_arrival(request)
        assert pages.admit(request), "a device-only match promotes at once"
        pages.take_promotion(request)
        self.hit_tokens += request.kv_len
        prompt_len = len(turn.prompt)
        while request.kv_len < prompt_len:  # prefill, chunk by chunk
            end = min(request.kv_len + CHUNK_TOKENS, prompt_len)
            assert pages.grow(request, end), "device too small for one chunk"
            request.kv_len = end
            pages.insert_computed(request)
        request.output_ids.append(turn.output[0])  # sampled by the prefill's last step
        for token in turn.output[1:]:  # decode: one token per step
            assert pages.grow(request, request.kv_len + 1), "device too small to decode"
            request.kv_len += 1
            request.output_ids.append(token)
        pages.release(request, keep_computed=True)

    def check(self) -> None:
        result = self.cache.check_integrity()
        assert result.ok, result.problems[:5]

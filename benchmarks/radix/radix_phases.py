"""The radix benchmark's three measurements, each on a real TieredCache of tiny pages.

Pages of 1 layer x 1 kv head x head_dim 4 (bf16, page_size 16: 256 B) make page copies free,
so what is timed is the tree: match, insert, lock, unlock, evict. The device is the only
tier, and its executors start no thread (nothing runs behind the timed calls' backs).
"""

from __future__ import annotations

import gc
import random
import statistics
import time

import torch

from tieredkv.cache.build import build_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig

from .no_transfers import NoTransferExecutor
from .radix_driver import ChatDriver, fresh_tokens, pack_prompt, timed
from .radix_workload import ChatShape, ChatWorkload

PAGE_SIZE = 16
TINY_LAYOUT = PageLayout(1, 1, 4, PAGE_SIZE, torch.bfloat16)
FINGERPRINT = b"tieredkv-bench-radix"


def tiny_cache(device_pages: int) -> TieredCache:
    """A device-only cache of `device_pages` tiny pages; no executor runs a transfer."""
    executor = NoTransferExecutor()
    config = CacheConfig(
        page_size=PAGE_SIZE,
        device_cache_bytes=device_pages * TINY_LAYOUT.page_bytes,
        host_cache_bytes=0,
    )
    return build_cache(
        config, TINY_LAYOUT, FINGERPRINT, "cpu", memory_executor=executor, disk_executor=executor
    )


def pages_per_user(shape: ChatShape) -> int:
    """An upper bound on the pages one finished conversation leaves in the tree."""
    return (shape.max_prompt + shape.answer[1]) // PAGE_SIZE + 1


MIN_P99_SAMPLES = 100  # below this, a "p99" is one of the few slowest calls


def summary(samples_ns: list[int]) -> dict[str, float | None]:
    """p50 / p99 / mean in µs of per-call nanosecond samples (p99 None under 100 samples)."""
    ordered = sorted(samples_ns)
    count = len(ordered)
    p99 = ordered[min(count - 1, count * 99 // 100)] / 1e3
    return {
        "count": count,
        "p50_us": ordered[count // 2] / 1e3,
        "p99_us": p99 if count >= MIN_P99_SAMPLES else None,
        "mean_us": statistics.fmean(ordered) / 1e3,
    }


def chat_calls(users: int, active: int, seed: int) -> tuple[dict[str, object], TieredCache]:
    """Every TieredCache call of `users` whole conversations, timed, and the packing of each
    prompt. The device holds them all (no eviction during the run). Returns the report and the
    cache, full of their pages."""
    workload = ChatWorkload(seed, active)
    cache = tiny_cache(users * pages_per_user(workload.shape) + pages_per_user(workload.shape))
    driver = ChatDriver(cache)
    prompt_lens: list[int] = []
    gc.collect()
    for turn in workload.turns(max_users=users):
        driver.run(turn)
        prompt_lens.append(len(turn.prompt))
    integrity = cache.check_integrity()
    report = {
        "users": users,
        "active_users": active,
        "turns": len(prompt_lens),
        "prompt_tokens": {
            "min": min(prompt_lens),
            "max": max(prompt_lens),
            "mean": statistics.fmean(prompt_lens),
        },
        "tree_nodes": cache.tree.num_nodes,
        "tree_pages": cache.device_pool.num_used,
        "integrity_ok": integrity.ok,
        **{
            name: summary(getattr(driver.times, name))
            for name in ("pack", "match", "insert", "lock", "unlock")
        },
    }
    return report, cache


def eviction_cost(cache: TieredCache, count: int, batch_pages: int) -> dict[str, object]:
    """`cache.evict(Tier.DEVICE, 1)` on a full device, `count` times (each freed page is taken
    again, untimed, so the device stays full); then `count // 10` evictions of `batch_pages`.
    µs per call and per evicted page."""
    held = cache.allocate(cache.device_pool.num_free) or []  # a full device
    singles: list[int] = []
    freed_single = 0
    for _ in range(count):
        assert timed(singles, cache.evict, Tier.DEVICE, 1), "nothing evictable"
        freed_single += cache.device_pool.num_free
        held += cache.allocate(cache.device_pool.num_free) or []
    batches: list[int] = []
    freed_batch = 0
    for _ in range(max(count // 10, 1)):
        timed(batches, cache.evict, Tier.DEVICE, batch_pages)
        freed_batch += cache.device_pool.num_free
        held += cache.allocate(cache.device_pool.num_free) or []
    cache.free(held)
    return {
        "evict_1": summary(singles),
        "evict_1_us_per_page": sum(singles) / 1e3 / max(freed_single, 1),
        "batch_pages": batch_pages,
        "evict_batch": summary(batches),
        "evict_batch_us_per_page": sum(batches) / 1e3 / max(freed_batch, 1),
        "integrity_ok": cache.check_integrity().ok,
        "tree_nodes_after": cache.tree.num_nodes,
    }


def match_scaling(
    node_counts: list[int], samples: int, active: int, seed: int
) -> list[dict[str, object]]:
    """Match cost as the tree grows: the chat workload runs (untimed) until the tree has each
    of `node_counts` nodes, then `samples` past prompts, drawn uniformly from every turn so far
    (reservoir sampling), are packed (untimed) and matched (timed), as the engine matches."""
    workload = ChatWorkload(seed + 1, active)
    nodes_per_user = 6  # fewer than seen (about 8: a document, then two per turn)
    users_bound = max(node_counts) // nodes_per_user + active
    cache = tiny_cache(users_bound * pages_per_user(workload.shape))
    driver = ChatDriver(cache)
    picker = random.Random(seed)
    reservoir: list[list[int]] = []
    turns = workload.turns(max_users=users_bound)
    points = []
    seen = 0
    for target in sorted(node_counts):
        for turn in turns:
            seen += 1
            if len(reservoir) < samples:
                reservoir.append(turn.prompt)
            elif (slot := picker.randrange(seen)) < samples:
                reservoir[slot] = turn.prompt
            driver.run(turn)
            if cache.tree.num_nodes >= target:
                break
        gc.collect()
        match_ns: list[int] = []
        for past in picker.choices(reservoir, k=samples):
            prompt = pack_prompt(fresh_tokens(past)).packed()
            start = time.perf_counter_ns()
            cache.match(prompt)
            match_ns.append(time.perf_counter_ns() - start)
        points.append(
            {
                "target_nodes": target,
                "tree_nodes": cache.tree.num_nodes,
                "users": workload.num_users,
                "match": summary(match_ns),
            }
        )
    return points

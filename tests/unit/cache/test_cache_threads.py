"""Threads have owners: a closed cache leaves none of its worker threads behind."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.tiny_cache import FINGERPRINT, disk_bytes_for, fill_device_pages, tiny_layout
from tieredkv.cache.build import build_cache
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import HELPER_THREAD_PREFIX
from tieredkv.config import CacheConfig, WritePolicy

LAYOUT = tiny_layout(page_size=4)
# the transfer queue's executors, the transfer jobs' helpers, the disk store's I/O threads
PREFIXES = ("tkv-copy", "tkv-disk", HELPER_THREAD_PREFIX, "tieredkv-disk-io")


def started_since(before: set[threading.Thread]) -> list[str]:
    """Names of live threads of the cache's pools that were not running at `before`."""
    return sorted(
        t.name for t in threading.enumerate() if t not in before and t.name.startswith(PREFIXES)
    )


def test_a_closed_cache_leaves_no_worker_threads(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    config = CacheConfig(
        page_size=LAYOUT.page_size,
        device_cache_bytes=20 * LAYOUT.page_bytes,
        host_cache_bytes=0,
        disk_cache_dir=tmp_path,
        disk_cache_bytes=disk_bytes_for(LAYOUT, 40),
        write_policy=WritePolicy.WRITE_THROUGH,
    )
    cache = build_cache(config, LAYOUT, FINGERPRINT, "cpu")  # real worker threads
    tokens = list(range(16 * LAYOUT.page_size + 1))
    pages = cache.allocate(16)
    assert pages is not None
    fill_device_pages(cache, tokens, "default", pages)
    cache.insert(tokens, "default", pages)  # write-through: 16 pages copied down to disk
    while cache.transfer_queue.in_flight:
        cache.wait(timeout=1.0)
    assert cache.check_integrity().ok
    assert Tier.DISK in cache.match(tokens).last_node.residence.copies
    running = started_since(before)
    assert any(name.startswith(HELPER_THREAD_PREFIX) for name in running), running
    assert any(name.startswith("tkv-disk") for name in running), running
    cache.close()
    assert started_since(before) == []

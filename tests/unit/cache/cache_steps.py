"""Steps the cache tests share: check integrity, compute and insert a prompt's pages, and run
every pending transfer to the end."""

from __future__ import annotations

from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import fill_device_pages
from tieredkv.cache.tiered_cache import TieredCache


def ok(cache: TieredCache) -> None:
    result = cache.check_integrity()
    assert result.ok, result.problems


def compute(cache: TieredCache, tokens: list[int], namespace: str = "default") -> None:
    """A request that computes every full page of `tokens` and inserts them."""
    pages = cache.allocate(len(tokens) // cache.page_size)
    assert pages is not None
    fill_device_pages(cache, tokens, namespace, pages)
    result = cache.insert(tokens, namespace, pages)
    cache.free([p for p in pages if p not in result.device_pages])
    ok(cache)


def settle(cache: TieredCache, executor: ManualTransferExecutor) -> None:
    while executor.pending():
        executor.complete_all()
        cache.poll()
    ok(cache)

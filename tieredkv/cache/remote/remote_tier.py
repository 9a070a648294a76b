"""`RemoteTier`: the remote store seen as the lowest tier's pool.

The tree indexes remote pages like any other copy: a node's remote copy is a list of page ids,
here virtual slots (nothing is allocated in Redis per slot; a page is named by its page key).
The slots bound how many remote pages this replica indexes (`REMOTE_INDEX_PAGES`), not what the
store holds: Redis's own `maxmemory` LRU bounds that, and tieredkv never deletes. Evicting a
remote copy forgets it here; the value stays in Redis for the other replicas. A retained
prompt's pages (`retain`) carry an expiry there instead, refreshed each time it is retained.

Transfer jobs move pages through `write_pages` (queued for the store's writer thread: never on a
request's path) and `read_pages_into` (one pipelined fetch, each verified page handed to the
transfer_jobs to copy into its destination; a page gone or refused is a miss, and so is every page
after it). `read_pages` fills a staging tensor the same way (the CUDA path). Health follows
the store: degraded while it is unreachable, healthy again once it reconnects (`degraded` is
read, never set from outside). `page_errors` and `state` report the store's counters (the
metrics, GET /debug/cache).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.pools.free_list import PageFreeList, PagePool
from tieredkv.cache.remote.record import RefusalReason, RemotePage
from tieredkv.cache.remote.store import PageSink, RemoteStore
from tieredkv.cache.tier import Tier

logger = logging.getLogger(__name__)

REMOTE_INDEX_PAGES = 1 << 18  # remote pages one replica indexes (96 GiB of bf16 default-model KV)
REMOTE_ERROR_REASONS = (*(reason.value for reason in RefusalReason), "unavailable")


def _rows(pages: torch.Tensor) -> torch.Tensor:
    """(n, page_bytes) uint8 view of page-major pages."""
    return pages.reshape(pages.shape[0], -1).view(torch.uint8)


class RemoteTier(PagePool):
    """The remote tier's pool: virtual slots over a `RemoteStore` (engine thread allocates;
    transfer threads call `read_pages` / `write_pages`)."""

    tier = Tier.REMOTE
    # one fetch at a time (a transfer job reads chunk k + 1 while it copies chunk k out): the
    # store's one call thread keeps each fetch inside its own budget, and Redis serves one
    # command at a time, so a second fetch on a second connection would only queue behind the first
    streams_reads = False
    hands_pages_on = True  # `read_pages_into`: pages go from the fetch to their destination

    def __init__(
        self, store: RemoteStore, layout: PageLayout, num_pages: int = REMOTE_INDEX_PAGES
    ) -> None:
        self.store = store
        self.layout = layout
        self.num_pages = num_pages
        self.page_bytes = layout.page_bytes
        self.free_list = PageFreeList(num_pages, self.tier.label)

    @property  # type: ignore[override]
    def degraded(self) -> bool:
        return self.store.degraded

    def mark_degraded(self, reason: str) -> None:
        """The store decides its own health (it reconnects by itself): only logged here."""
        logger.warning("remote tier: %s", reason)

    def page_errors(self) -> dict[str, int]:
        """Values refused by reason (`REMOTE_ERROR_REASONS`) and calls that failed or ran past
        their budget (unavailable)."""
        counters = self.store.counters()
        return {**counters.refused, "unavailable": counters.errors}

    def state(self) -> dict:
        """The store's counters, health, last error and Redis's maxmemory-policy."""
        counters = dataclasses.asdict(self.store.counters())
        return {
            **counters,
            "degraded": self.degraded,
            "last_error": self.store.last_error,
            "memory_policy": self.store.memory_policy,
        }

    def lookup(self, keys: list[bytes]) -> int:
        """How many leading `keys` the store holds (one round trip; 0 while degraded)."""
        return self.store.lookup(keys)

    def write_pages(
        self, slots: list[int], records: list[PageRecord], payload: torch.Tensor
    ) -> None:
        """Queue `payload`'s pages (n, *page_shape) for writing under their records' keys."""
        assert len(slots) == len(records) == payload.shape[0], "one record and page per slot"
        rows = _rows(payload.contiguous()).numpy()
        self.store.put(
            [
                RemotePage(record.key, record.parent_key, record.tokens, row.tobytes())
                for record, row in zip(records, rows, strict=True)
            ]
        )

    def retain(self, keys: list[bytes], ttl_s: float) -> None:
        """Give the pages of `keys` (a retained prompt's) `ttl_s` to live in the store from now
        (queued for the store's writer thread)."""
        self.store.retain(keys, ttl_s)

    def take_lost(self) -> set[bytes]:
        """Keys of retained pages the store no longer held when their expiry was set (to be
        written again); each reported once."""
        return self.store.take_lost()

    def read_pages(
        self, slots: list[int], records: list[PageRecord], out: torch.Tensor
    ) -> list[bool]:
        """Fill out[i] with the page named by records[i] (as `read_pages_into`)."""
        assert len(slots) == len(records) == out.shape[0], "one record and page per slot"
        rows = _rows(out).numpy()  # CPU: host pages or the transfer jobs' host staging

        def into_out(index: int, data: memoryview) -> None:
            rows[index] = np.frombuffer(data, dtype=np.uint8)

        return self.read_pages_into(slots, records, into_out)

    def read_pages_into(
        self, slots: list[int], records: list[PageRecord], sink: PageSink
    ) -> list[bool]:
        """Hand the page named by records[i] to `sink(i, data)` (on the store's call thread,
        in order, never after this returns). True for the pages handed on, up to the first
        the store no longer has (or refused): from there on they are misses, to be computed."""
        assert len(slots) == len(records), "one record per slot"
        delivered = self.store.fetch_into([record.key for record in records], sink)
        page_ok: list[bool] = []
        for found in delivered:
            page_ok.append(found and (not page_ok or page_ok[-1]))
        return page_ok

    def close(self) -> None:
        self.store.close()

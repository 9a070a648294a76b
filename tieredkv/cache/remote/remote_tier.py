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
from collections.abc import Iterable

import numpy as np
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.pools.free_list import PageFreeList, PagePool
from tieredkv.cache.remote.delivery import PageSink
from tieredkv.cache.remote.part_values import RemotePageParts, page_rows, sliding_key
from tieredkv.cache.remote.record import RefusalReason, RemotePage
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.tier import Tier

logger = logging.getLogger(__name__)

REMOTE_INDEX_PAGES = 1 << 18  # remote pages one replica indexes (96 GiB of bf16 default-model KV)
REMOTE_ERROR_REASONS = (*(reason.value for reason in RefusalReason), "unavailable")


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
        self,
        store: RemoteStore,
        layout: PageLayout,
        num_pages: int = REMOTE_INDEX_PAGES,
        parts: PageParts | None = None,
    ) -> None:
        """`parts` with sliding layers: a page is stored as its parts (`part_values`), the
        sliding one only where the copy keeps it."""
        self.store = store
        self.layout = layout
        self.num_pages = num_pages
        self.page_bytes = layout.page_bytes
        self.free_list = PageFreeList(num_pages, self.tier.label)
        self.page_parts = RemotePageParts(parts) if parts and parts.has_sliding else None
        self.gap_slots: set[int] = set()  # slots whose copy keeps no sliding part

    def note_gaps(self, slots: Iterable[int]) -> None:
        """The copies in `slots` keep no sliding part (until freed)."""
        self.gap_slots.update(slots)

    def free(self, pages: list[int]) -> None:
        self.gap_slots.difference_update(pages)
        super().free(pages)

    @property
    def num_sliding_held(self) -> int:
        """Allocated slots whose copy keeps its sliding part."""
        return self.num_used - len(self.gap_slots)

    @property
    def keeps_parts(self) -> bool:
        """Does a page's copy here keep its sliding part only where the rule wants it?"""
        return self.page_parts is not None

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

    def lookup(self, keys: list[bytes]) -> tuple[int, frozenset[int]]:
        """How many leading `keys` the store holds, and which of those pages it holds without
        their sliding part (one round trip; 0 while degraded)."""
        if self.page_parts is None:
            return self.store.lookup(keys), frozenset()
        count, held = self.store.lookup_also(keys, [sliding_key(key) for key in keys])
        return count, frozenset(index for index in range(count) if not held[index])

    def write_pages(
        self, slots: list[int], records: list[PageRecord], payload: torch.Tensor
    ) -> None:
        """Queue `payload`'s pages (n, *page_shape) for writing under their records' keys."""
        assert len(slots) == len(records) == payload.shape[0], "one record and page per slot"
        if self.page_parts is not None:
            self.store.put(self.page_parts.values(records, payload))
            return
        rows = page_rows(payload.contiguous())
        self.store.put(
            [
                RemotePage(record.key, record.parent_key, record.tokens, row.tobytes())
                for record, row in zip(records, rows, strict=True)
            ]
        )

    def drop_sliding(self, keys: list[bytes], slots: list[int]) -> None:
        """The copies in `slots` (pages of `keys`) keep their sliding part no longer: its
        values are deleted from the store (queued for the writer thread)."""
        assert self.page_parts is not None, "whole pages have no part to drop"
        self.note_gaps(slots)
        self.store.discard([sliding_key(key) for key in keys])

    def retain(self, keys: list[bytes], ttl_s: float) -> None:
        """Give the pages of `keys` (a retained prompt's) `ttl_s` to live in the store from now
        (queued for the store's writer thread): both values of a page kept as parts."""
        if self.page_parts is not None:
            keys = [*keys, *(sliding_key(key) for key in keys)]
        self.store.retain(keys, ttl_s)

    def take_lost(self) -> set[bytes]:
        """Keys of retained pages the store no longer held when their expiry was set (to be
        written again); each reported once. A sliding part's key names no page of the tree:
        its loss costs reuse (the match is cut there), not a write."""
        return self.store.take_lost()

    def read_pages(
        self, slots: list[int], records: list[PageRecord], out: torch.Tensor
    ) -> list[bool]:
        """Fill out[i] with the page named by records[i] (as `read_pages_into`)."""
        assert len(slots) == len(records) == out.shape[0], "one record and page per slot"
        rows = page_rows(out)  # CPU: host pages or the transfer jobs' host staging

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
        parts = self.page_parts
        if parts is None:
            delivered = self.store.fetch_into([record.key for record in records], sink)
        else:
            plan = parts.plan(records)
            values = self.store.fetch_into(plan.keys, parts.assembling(plan, sink), plan.sizes)
            delivered = parts.pages_delivered(plan, values, len(records))
        page_ok: list[bool] = []
        for found in delivered:
            page_ok.append(found and (not page_ok or page_ok[-1]))
        return page_ok

    def close(self) -> None:
        self.store.close()

"""A page of a model with sliding-window layers as remote values, one a part (`PageParts`).

The full part (the full layers) is stored under the page's own name, and the sliding part,
where the copy keeps it, under the name of a key derived from the page key (`sliding_key`):
a page whose sliding part no continuation reads (`sliding_pages`) costs Redis its full part
only. Each value is sealed with its own name and size, so one part is never served for the
other. Reading a page asks for both of its values and hands it on whole, with zeros in the
sliding layers where its copy keeps no sliding part (its gaps say so; the attention never
reads them). A page whose copy keeps the sliding part is handed on only when both values
arrived: a sliding value Redis evicted makes the page a miss, never a page with stale layers.

Without sliding layers a page is one value under its own name, as ever.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tieredkv.cache.index.page_key import KEY_BYTES
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.remote.delivery import PageSink
from tieredkv.cache.remote.record import RemotePage

_SLIDING_PERSON = b"tieredkv-sliding"  # 16 bytes: BLAKE2b's personalisation


def sliding_key(page_key: bytes) -> bytes:
    """The key a page's sliding part is stored under (named like a page key)."""
    return hashlib.blake2b(page_key, digest_size=KEY_BYTES, person=_SLIDING_PERSON).digest()


def page_rows(pages: torch.Tensor) -> np.ndarray:
    """(n, bytes) uint8 rows of a contiguous CPU tensor of pages (or of parts of pages), a view:
    what is written into them lands in `pages`."""
    assert pages.is_contiguous(), "rows are a view of contiguous pages"
    return pages.reshape(pages.shape[0], -1).view(torch.uint8).numpy()


@dataclass(frozen=True)
class FetchPlan:
    """The values a read asks for, in order (each page's full part, then its sliding part if
    its copy keeps one), their sizes, and for each value the page it belongs to and whether it
    is the page's last."""

    keys: list[bytes]
    sizes: list[int]
    page_of: list[int]
    sliding: list[bool]
    completes: list[bool]


class RemotePageParts:
    """Splits pages into their remote values and assembles them back (one reader at a time:
    the remote tier's fetches run on the store's one call thread)."""

    def __init__(self, parts: PageParts) -> None:
        assert parts.has_sliding, "a page without sliding layers is one value"
        self.parts = parts
        self.layer_bytes = parts.layer_page_bytes
        self._page = np.zeros(parts.layout.page_bytes, dtype=np.uint8)
        self._layers = self._page.reshape(parts.layout.num_layers, self.layer_bytes)

    def values(self, records: Sequence[PageRecord], pages: torch.Tensor) -> list[RemotePage]:
        """The values of page-major `pages` (n, *page_shape): each page's full part, and its
        sliding part where `record.sliding_held`."""
        full = page_rows(self.parts.gather(pages, sliding=False).contiguous())
        sliding = page_rows(self.parts.gather(pages, sliding=True).contiguous())
        values = []
        for index, record in enumerate(records):
            values.append(RemotePage(record.key, record.parent_key, record.tokens, full[index]))
            if record.sliding_held:
                key = sliding_key(record.key)
                values.append(RemotePage(key, record.key, record.tokens, sliding[index]))
        return values

    def plan(self, records: Sequence[PageRecord]) -> FetchPlan:
        plan = FetchPlan([], [], [], [], [])
        for index, record in enumerate(records):
            parts = [(record.key, False)]
            if record.sliding_held:
                parts.append((sliding_key(record.key), True))
            for position, (key, sliding) in enumerate(parts):
                plan.keys.append(key)
                plan.sizes.append(self.parts.sliding_bytes if sliding else self.parts.full_bytes)
                plan.page_of.append(index)
                plan.sliding.append(sliding)
                plan.completes.append(position == len(parts) - 1)
        return plan

    def assembling(self, plan: FetchPlan, sink: PageSink) -> PageSink:
        """A sink for the plan's values that hands each page, whole, to `sink(page, data)` once
        all its values arrived in order (a page missing a value is not handed on)."""
        arrived = [0] * (plan.page_of[-1] + 1 if plan.page_of else 0)

        def on_value(index: int, data: memoryview) -> None:
            page = plan.page_of[index]
            if plan.sliding[index]:
                if arrived[page] != 1:
                    return  # its full part is missing
                self._place(data, self.parts.sliding_layers)
            else:
                self._place(data, self.parts.full_layers)
                self._layers[list(self.parts.sliding_layers)] = 0
            arrived[page] += 1
            if plan.completes[index]:
                sink(page, memoryview(self._page))

        return on_value

    def _place(self, data: memoryview, layers: tuple[int, ...]) -> None:
        part = np.frombuffer(data, dtype=np.uint8).reshape(len(layers), self.layer_bytes)
        self._layers[list(layers)] = part

    @staticmethod
    def pages_delivered(plan: FetchPlan, delivered: Sequence[bool], num_pages: int) -> list[bool]:
        """Per page: every value of it delivered."""
        whole = [True] * num_pages
        for index, found in enumerate(delivered):
            whole[plan.page_of[index]] &= found
        return whole

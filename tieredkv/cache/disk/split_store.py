"""The disk tier for a model with sliding-window layers: a page's layers in records of their own.

A model with sliding-window layers needs a page's sliding part only within the window before a
reuse point (`sliding_pages`), so the disk keeps every page's full part and the sliding part
only where a copy gave one (`residency.sliding_room`), as the split host pool does. The store
file's slots are layer pages (`layer_pages`): a record holds one layer of one page, named by the
page's key and the layer (`disk.format`: a layer record). A page's full part takes
`full_layers` slots, its sliding part `sliding_layers` more, any of them, so the split between
pages with and without a sliding part follows what the pages need: where every page keeps its
sliding part the file holds as many pages as whole-page records would; where few do, up to
`(full + sliding) / full` times more.

Reads and writes move a batch's layer records in slot order through one aligned buffer, so a
run of consecutive slots still moves with one system call per chunk (`DiskStore`), and a page
is served only when every layer it is read for verifies. A warm restart (`scan`) groups the
records by page key: a page with all its full layers is found again, with its sliding part
where all its sliding layers are there too; the records of anything less are freed.

Threads: as `DiskStore` (page ids and the page table belong to the engine thread; the
transfer queue's disk workers read the table rows of the pages they were given).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import torch

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.store import CHUNK_BYTES, DiskStore, PagesVerified
from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.pools.free_list import PagePool
from tieredkv.cache.pools.layer_pages import LayerPages
from tieredkv.cache.tier import Tier

LAYER_RECORDS = "layer-records"  # joins the superblock's layout text: whole-page stores differ


@dataclasses.dataclass(frozen=True)
class _LayerPlan:
    """The layer records a batch of pages moves, in slot order."""

    slots: list[int]  # the layer records' slots, ascending
    rows: torch.Tensor  # for each, its row in the batch's (pages * layers) layer pages
    records: list[PageRecord]  # for each, the layer record it is
    page_of: np.ndarray  # for each, the index of its page in the batch
    unreadable: np.ndarray  # pages a layer they are read for has no record of


class SplitDiskStore(LayerPages, PagePool):
    """Page ids over a `DiskStore` whose records are layer pages (`LayerPages` keeps the page
    table); reads and writes take whole pages, as `DiskStore`'s do."""

    tier = Tier.DISK
    streams_reads = True

    def __init__(
        self,
        directory: Path,
        fingerprint: bytes,
        parts: PageParts,
        capacity_bytes: int,
        io: DiskIOBackend | None = None,
        codec: str = "raw",
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        layout = parts.layout
        self.records = DiskStore(
            directory,
            fingerprint,
            dataclasses.replace(layout, num_layers=1),  # a record: one layer of one page
            capacity_bytes,
            io=io,
            codec=codec,
            chunk_bytes=chunk_bytes,
            parts=f"{parts.describe()};{LAYER_RECORDS}",
        )
        self._init_layer_pages(parts, self.records.num_pages, self.tier.label)
        self.unit_free = self.records.free_list  # the store's slots are the layer pages
        self.layout = layout
        self.page_bytes = parts.full_bytes
        self._num_layers = layout.num_layers
        self._local = threading.local()

    # --- what the tier offers beside its pages ----------------------------------------------

    @property  # type: ignore[override]
    def degraded(self) -> bool:
        return self.records.degraded

    def mark_degraded(self, reason: str) -> None:
        self.records.mark_degraded(reason)

    @property
    def direct_io(self) -> bool:
        return self.records.direct_io

    @property
    def file_bytes(self) -> int:
        return self.records.file_bytes

    def page_errors(self) -> dict[DiskErrorReason, int]:
        """Layer records or files refused so far, by reason (every reason present)."""
        return self.records.page_errors()

    def _alloc_units(self, count: int) -> list[int]:
        return self.records.alloc(count)  # ascending: a page's layers move as one run

    def _free_units(self, units: list[int]) -> None:
        self.records.free(units)  # their headers zeroed first: a restart does not find them

    # --- reads and writes (disk workers) ----------------------------------------------------

    def write_pages(
        self, pages: list[int], records: list[PageRecord], payload: torch.Tensor
    ) -> None:
        """Write `payload` (n, num_layers, 2, page_size, kv_heads, head_dim), page-major, CPU:
        each page's full layers, and its sliding layers where it has a sliding part and its
        record holds them. Raises OSError as `DiskStore.write_pages`."""
        assert len(pages) == len(records) == payload.shape[0], "one record and page per page"
        plan = self._plan(pages, records, reading=False)
        if not plan.slots:
            return
        staged = self._staging(len(plan.slots))
        torch.index_select(self._layer_rows(payload), 0, plan.rows, out=staged)
        self.records.write_pages(plan.slots, plan.records, staged)

    def read_pages(
        self,
        pages: list[int],
        expected: list[PageRecord | bytes],
        out: torch.Tensor,
        on_verified: PagesVerified | None = None,
    ) -> list[bool]:
        """Fill out[i] from page `pages[i]`: True where every layer it is read for (its full
        layers, and its sliding layers unless its expected record lacks them) verifies against
        the expected page; the layers not read are zeros, and a page that fails is zeros. I/O
        errors raise OSError. `on_verified(0, n, flags)` once the batch is in place."""
        plan = self._plan(pages, expected, reading=True)
        layer_rows = self._layer_rows(out)
        verified = np.ones(len(pages), dtype=bool)
        verified[plan.unreadable] = False
        read = torch.zeros(len(layer_rows), dtype=torch.bool)
        if plan.slots:
            staged = self._staging(len(plan.slots))
            unit_ok = np.array(self.records.read_pages(plan.slots, plan.records, staged))
            verified[plan.page_of[~unit_ok]] = False
            layer_rows.index_copy_(0, plan.rows, staged)
            read[plan.rows] = True
        read.view(len(pages), -1)[torch.from_numpy(~verified)] = False
        layer_rows[~read] = 0
        flags = verified.tolist()
        if on_verified is not None:
            on_verified(0, len(pages), flags)
        return flags

    def _plan(
        self, pages: list[int], records: list[PageRecord | bytes] | list[PageRecord], reading: bool
    ) -> _LayerPlan:
        """The layer records of `pages`: every full layer, and the sliding layers of the pages
        whose record holds them (a read: the ones the page has a sliding part for, where the
        expected record is only a key)."""
        table = self.table[np.asarray(pages, dtype=np.intp)]  # (n, layers)
        wanted = np.zeros_like(table, dtype=bool)
        wanted[:, self._full] = True
        holds = np.array([_holds_sliding(r) for r in records], dtype=bool)
        if reading:  # a key alone reads the sliding part the page has
            keyed = np.array([not isinstance(r, PageRecord) for r in records], dtype=bool)
            holds &= ~keyed | (table[:, self._sliding] >= 0).all(axis=1)
        wanted[np.ix_(holds, self._sliding)] = True
        unreadable = np.flatnonzero((wanted & (table < 0)).any(axis=1))
        wanted &= table >= 0
        page_of, layer_of = np.nonzero(wanted)
        slots = table[page_of, layer_of]
        order = np.argsort(slots, kind="stable")
        page_of, layer_of, slots = page_of[order], layer_of[order], slots[order]
        layer_records = [
            _layer_record(records[page], layer)
            for page, layer in zip(page_of.tolist(), layer_of.tolist(), strict=True)
        ]
        rows = torch.from_numpy(page_of * self._num_layers + layer_of)
        return _LayerPlan(slots.tolist(), rows, layer_records, page_of, unreadable)

    def _layer_rows(self, pages: torch.Tensor) -> torch.Tensor:
        """(n * layers, 1, 2, page_size, kv_heads, head_dim): a view of page-major pages."""
        shape = self.layout.page_shape
        assert pages.shape[1:] == shape and pages.is_contiguous() and pages.device.type == "cpu"
        return pages.view(-1, 1, *shape[1:])

    def _staging(self, count: int) -> torch.Tensor:
        """This thread's aligned buffer of `count` layer pages (O_DIRECT moves it in place)."""
        shape = (1, *self.layout.page_shape[1:])
        buffer = getattr(self._local, "staging", None)
        if buffer is None or buffer.shape[0] < count:
            raw = aligned_empty(count * self.parts.layer_page_bytes)
            buffer = torch.from_numpy(raw).view(self.layout.dtype).view(count, *shape)
            self._local.staging = buffer
        return buffer[:count]

    # --- warm restart and closing (engine thread) -------------------------------------------

    def scan(self) -> list[tuple[int, PageRecord]]:
        """Warm restart: the pages whose full layers' records all verify, each under a page id
        of its own (its sliding part held where all its sliding layers' records verify too).
        The records of anything less (a page cut by a crash between its layers' writes, a
        sliding part missing a layer, a duplicate) are freed. Call once, before any alloc."""
        by_key: dict[bytes, tuple[PageRecord, dict[int, int]]] = {}
        stale: list[int] = []
        for slot, record in self.records.scan():
            layers = by_key.setdefault(record.key, (record, {}))[1]
            layer = record.layer
            if layer is None or not 0 <= layer < self._num_layers or layer in layers:
                stale.append(slot)
            else:
                layers[layer] = slot
        found: list[tuple[int, PageRecord]] = []
        full, sliding = self._full.tolist(), self._sliding.tolist()
        for record, layers in by_key.values():
            held = all(layer in layers for layer in sliding)
            # a page needs its full layers; where all layers slide, its sliding part
            if not all(layer in layers for layer in full) or not (full or held):
                stale.extend(layers.values())
                continue
            if not held:
                stale.extend(layers.pop(layer) for layer in sliding if layer in layers)
            (page,) = self.free_list.alloc(1)
            self.table[page, list(layers)] = list(layers.values())
            if held:
                self.sliding_of.add(page)
            page_record = PageRecord(
                record.key, record.parent_key, record.tokens, sliding_held=held
            )
            found.append((page, page_record))
        if stale:
            self.records.free(stale)
        return found

    def close(self) -> None:
        self.records.close()


def _holds_sliding(record: PageRecord | bytes) -> bool:
    return not isinstance(record, PageRecord) or record.sliding_held


def _layer_record(record: PageRecord | bytes, layer: int) -> PageRecord:
    """The record of one layer of a page: a layer record names the page and its layer (a read
    that knows only the page's key compares just those)."""
    if isinstance(record, PageRecord):
        return PageRecord(record.key, record.parent_key, record.tokens, layer=layer)
    return PageRecord(record, b"", (), layer=layer)

"""The disk tier: fixed-size page records in one preallocated file, verified on every read.

Threads: `alloc`, `free`, `invalidate`, `scan` and `close` belong to the engine thread;
`write_pages` and `read_pages` run on the transfer queue's disk workers, any number at once, on
slots the engine allocated to them (a slot is never freed while a transfer on it is in flight).

Crash safety (process crash, kill -9; not power loss, so no fsync per write): a run of slots is
written payload first, then header; the header carries a checksum over itself and the stored
payload. A record is live only once its header is complete, a freed slot's header is zeroed,
and a torn or half-written record fails its checksum: a miss, never served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.directory import (
    OpenedFile,
    lock_directory,
    open_store_file,
    prepare_directory,
    superblock_for,
)
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.format import (
    RecordHeader,
    chain_ok,
    decode_header,
    encode_header,
)
from tieredkv.cache.disk.page_file import PageFile, slot_runs
from tieredkv.cache.disk.pipeline import ChunkPipeline
from tieredkv.cache.disk.scan import scan_headers
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_record import CODECS, PageRecord, lz4_block
from tieredkv.cache.pools.free_list import PageFreeList, PagePool
from tieredkv.cache.read_priority import ReadPriority
from tieredkv.cache.tier import Tier
from tieredkv.errors import DiskStoreError

logger = logging.getLogger(__name__)

# A run of slots moves as chunks of about CHUNK_BYTES, IO_DEPTH of them in flight while the
# calling worker checksums the next (see disk_pipeline).
CHUNK_BYTES = 32 << 20
IO_DEPTH = 2
IO_THREADS = 4  # the store's read threads, shared by every read
# Writes have threads of their own: a write's chunks, submitted before a read began, must not
# hold the threads the read needs (a write's pipeline keeps up to three chunks submitted, and
# the shared threads numbered four: two write-throughs could hold them all).
WRITE_IO_THREADS = 2
MIN_CHUNKS = 4
MIN_CHUNK_BYTES = 1 << 20

# on_verified(start, end, flags): pages start..end - 1 of a read are in place, flags[i] True
# where page start + i verified
PagesVerified = Callable[[int, int, list[bool]], None]


def _serves(header: RecordHeader, expected: PageRecord | bytes) -> bool:
    """The record is the page asked for, and holds the layers the reader's copy counts on (a
    record without its sliding part never stands in for a copy that keeps it; a layer record,
    the layer asked for)."""
    if not isinstance(expected, PageRecord):
        return header.key == expected and header.layer is None
    held = header.sliding_held or not expected.sliding_held
    return header.key == expected.key and held and header.layer == expected.layer


def _named(header: RecordHeader) -> tuple[bytes, bytes, tuple[int, ...]]:
    return header.key, header.parent_key, header.tokens


def _page_rows(pages: torch.Tensor, layout: PageLayout) -> np.ndarray:
    """A (n, page_bytes) uint8 view of a page-major CPU tensor, no copy."""
    assert pages.shape[1:] == layout.page_shape, f"{tuple(pages.shape)} vs {layout.page_shape}"
    assert pages.dtype == layout.dtype and pages.device.type == "cpu" and pages.is_contiguous()
    return pages.view(torch.uint8).numpy().reshape(pages.shape[0], layout.page_bytes)


class DiskStore(PagePool):
    """Fixed-size page records under `directory`, owned by one process (exclusive flock).

    A pool like the others: page ids are record slots, handed out by a `PageFreeList`. A failed
    write or invalidation degrades it (see `PagePool.degraded`).
    """

    tier = Tier.DISK
    # read_pages hands chunks on as they verify (`on_verified`), over parallel I/O: a transfer job
    # reads two of its chunks at once and copies them out as they come
    streams_reads = True

    def __init__(
        self,
        directory: Path,
        fingerprint: bytes,
        layout: PageLayout,
        capacity_bytes: int,
        io: DiskIOBackend | None = None,
        codec: str = "raw",
        chunk_bytes: int = CHUNK_BYTES,
        parts: str = "",
    ) -> None:
        if codec not in CODECS:
            raise DiskStoreError(f"disk store codec must be one of {sorted(CODECS)}, got {codec!r}")
        if codec == "lz4":
            lz4_block()  # fail at start, with the fix in the message, if the package is missing
        self.directory = Path(directory)
        self.layout = layout
        self.codec = CODECS[codec]
        self.io = io if io is not None else DiskIOBackend()
        self.error_counts = dict.fromkeys(DiskErrorReason, 0)
        self._lock = threading.Lock()  # error counts and the degraded flag: workers report too
        wanted = superblock_for(layout, fingerprint, capacity_bytes, parts)
        prepare_directory(self.directory)
        self._lock_handle: int | None = lock_directory(self.io, self.directory)
        try:
            opened = open_store_file(self.io, self.directory, wanted, self._count_error)
        except BaseException:
            self.io.close(self._lock_handle)
            raise
        self._opened: OpenedFile = opened
        self._file = PageFile(self.io, opened.handle, opened.superblock, layout.page_bytes)
        self.num_pages = opened.superblock.num_slots
        self.page_bytes = layout.page_bytes
        self.free_list = PageFreeList(self.num_pages, self.tier.label)
        self.direct_io = self._file.direct_io
        self._chunk_pages = max(chunk_bytes // opened.superblock.record_bytes, 1)
        self._min_chunk_pages = max(MIN_CHUNK_BYTES // opened.superblock.record_bytes, 1)
        self._read_pipeline = ChunkPipeline(IO_THREADS, IO_DEPTH, "tieredkv-disk-read")
        self._write_pipeline = ChunkPipeline(WRITE_IO_THREADS, IO_DEPTH, "tieredkv-disk-write")
        self.read_priority = ReadPriority()
        logger.info(
            "disk store %s: %d pages of %d B, O_DIRECT %s",
            self.directory,
            self.num_pages,
            layout.page_bytes,
            "on" if self.direct_io else "off",
        )

    def _count_error(self, reason: DiskErrorReason, count: int = 1) -> None:
        with self._lock:
            self.error_counts[reason] += count

    def page_errors(self) -> dict[DiskErrorReason, int]:
        """Records or files refused so far, by reason (every reason present)."""
        with self._lock:
            return dict(self.error_counts)

    def mark_degraded(self, reason: str) -> None:
        with self._lock:
            super().mark_degraded(reason)

    @property
    def file_bytes(self) -> int:
        """The store file's size: superblock, headers and records."""
        return self._opened.superblock.file_bytes

    def alloc(self, count: int) -> list[int]:
        """Take `count` record slots, all or nothing (OutOfPagesError), in ascending order: a
        batch written to consecutive slots moves with one request per chunk, not per page."""
        return sorted(self.free_list.alloc(count))

    def free(self, slots: list[int]) -> None:
        """Return slots and zero their headers so a restart does not bring them back. A failed
        invalidation is counted (IO) and logged: the slot's next write still cannot verify
        against the old header, because the record checksum covers the payload."""
        try:
            self.invalidate(slots)
        except OSError as error:
            self._count_error(DiskErrorReason.IO)
            logger.warning(
                "disk store: invalidating %d freed records failed: %s", len(slots), error
            )
            self.mark_degraded("a freed record could not be invalidated")
        self.free_list.free(sorted(slots, reverse=True))  # the lowest slot is handed out first

    def invalidate(self, slots: list[int]) -> None:
        """Zero the headers of `slots` (their records become misses). Raises OSError."""
        ordered = sorted(slots)
        zeros = bytes(self._file.block.header_bytes)
        for start, length in slot_runs(ordered):
            self._file.write_headers(ordered[start], zeros * length)

    def write_pages(
        self, slots: list[int], records: list[PageRecord], payload: torch.Tensor
    ) -> None:
        """Write `payload` (n, num_layers, 2, page_size, kv_heads, head_dim), the layout's dtype,
        page-major, CPU, one page per slot. Returns once every byte is written. Raises OSError
        (counted IO, store degraded); the slots' records are then misses, all others intact."""
        assert len(slots) == len(records) == payload.shape[0], "one record and page per slot"
        rows = _page_rows(payload, self.layout)  # (n, page_bytes) uint8
        header_bytes = self._file.block.header_bytes

        def encode(start: int, end: int) -> tuple[list, bytes]:  # checksums: calling thread
            # waits first: no hashing for a write while a read's verify needs the cores
            self.read_priority.before_write()
            stored = [self._file.encode(row, self.codec) for row in rows[start:end]]
            headers = b"".join(
                encode_header(
                    header_bytes,
                    codec,
                    r.key,
                    r.parent_key,
                    r.tokens,
                    data,
                    r.sliding_held,
                    r.layer,
                )
                for r, (codec, data) in zip(records[start:end], stored, strict=True)
            )
            return stored, headers

        def write(start: int, end: int, encoded: tuple[list, bytes]) -> None:  # I/O thread
            # again here: a chunk encoded before a read began and still queued waits for it
            self.read_priority.before_write()
            self._file.write_payloads(slots[start], rows[start:end], encoded[0])

        try:
            for start, length in slot_runs(slots):
                headers = self._write_pipeline.run(
                    self._chunks(start, length), encode, write, lambda s, e, enc, _: enc[1]
                )
                self._file.write_headers(slots[start], b"".join(headers))  # after the payloads
        except OSError as error:
            self._count_error(DiskErrorReason.IO)
            self.mark_degraded(f"write failed: {error}")
            raise

    def _chunks(self, start: int, length: int) -> list[tuple[int, int]]:
        """Split a run into chunks of at most chunk_bytes, and into at least MIN_CHUNKS of at
        least MIN_CHUNK_BYTES where it is long enough, so that a small batch too overlaps its
        checksums with its I/O."""
        step = min(self._chunk_pages, max(-(-length // MIN_CHUNKS), self._min_chunk_pages))
        end = start + length
        return [(s, min(s + step, end)) for s in range(start, end, step)]

    def read_pages(
        self,
        slots: list[int],
        expected: list[PageRecord | bytes],
        out: torch.Tensor,
        on_verified: PagesVerified | None = None,
    ) -> list[bool]:
        """Fill out[i] (same shape rules as write_pages) from slots[i]; True when the record
        verifies: header and payload checksum, key == page_key(parent_key, tokens), and key ==
        the expected record's key. False (counted CHECKSUM) is a miss; out[i] is zeroed.
        I/O errors raise OSError (counted IO).

        Every run's chunks share one pipeline, so the disk stays busy across runs. With
        `on_verified`, each chunk is handed on as soon as it is verified, in order, on this
        thread: `on_verified(start, end, flags)` for out[start:end], while later chunks are
        still being read (the caller copies them out, overlapping its copies with the I/O)."""
        rows = _page_rows(out, self.layout)  # (n, page_bytes) uint8
        headers: list[RecordHeader | None] = []

        def read(start: int, end: int, _: None) -> list[bool] | None:  # I/O thread
            return self._read_chunk(slots[start], headers[start:end], rows[start:end])

        def verify(start: int, end: int, _: None, done: list[bool] | None) -> list[bool]:
            if done is None:  # the raw bytes landed in place, unverified
                done = self._file.verify_in_place(headers[start:end], rows[start:end])
            flags = [
                ok and header is not None and _serves(header, want)
                for ok, header, want in zip(
                    done, headers[start:end], expected[start:end], strict=True
                )
            ]
            for index, ok in enumerate(flags, start):
                if not ok:
                    rows[index] = 0
            if on_verified is not None:
                on_verified(start, end, flags)
            return flags

        runs = slot_runs(slots)
        chunks = [chunk for start, length in runs for chunk in self._chunks(start, length)]
        try:
            with self.read_priority.reading():  # writes wait while a request waits for this
                for start, length in runs:
                    headers += self._read_headers(slots[start], length)
                verified = [
                    ok
                    for flags in self._read_pipeline.run(chunks, lambda s, e: None, read, verify)
                    for ok in flags
                ]
        except OSError:
            self._count_error(DiskErrorReason.IO)
            raise
        misses = verified.count(False)
        if misses:
            self._count_error(DiskErrorReason.CHECKSUM, misses)
            logger.warning("disk store: %d of %d records failed to verify", misses, len(slots))
        return verified

    def _read_chunk(
        self, first_slot: int, headers: list[RecordHeader | None], rows: np.ndarray
    ) -> list[bool] | None:
        """I/O thread: None when the raw bytes landed in `rows` unverified (the caller checks
        them), else the verified flags of a read through the bounce buffer."""
        if self._file.read_in_place(first_slot, headers, rows):
            return None
        return self._file.read_payloads(first_slot, headers, rows)

    def _read_headers(self, first_slot: int, count: int) -> list[RecordHeader | None]:
        raw = self._file.read_headers(first_slot, count)
        headers = [decode_header(row, self.layout.page_size) for row in raw]
        # a page's layer records name the same page: hash each (key, parent, tokens) once
        chained: dict[tuple, bool] = {}
        for header in headers:
            if header is not None and (named := _named(header)) not in chained:
                chained[named] = chain_ok(header)
        return [h if h is not None and chained[_named(h)] else None for h in headers]

    def scan(self) -> list[tuple[int, PageRecord]]:
        """Warm restart: one sequential read of the header region. Returns every slot whose
        header verifies and whose key chains, and marks those slots used. Corrupt, torn or
        truncated-away records are counted (CHECKSUM) and invalidated. Call once, right
        after opening, before any alloc."""
        if self.num_free != self.num_pages:
            raise DiskStoreError("DiskStore.scan() must run before any slot is allocated")
        found, bad = scan_headers(self._file, self.layout.page_size, self._opened.intact_bytes)
        if bad:
            self._count_error(DiskErrorReason.CHECKSUM, len(bad))
            logger.warning("disk store scan: %d corrupt or torn records invalidated", len(bad))
            self.invalidate(bad)
        self.free_list.take(slot for slot, _ in found)
        logger.info("disk store scan: %d records found", len(found))
        return found

    def close(self) -> None:
        """Close the file and release the directory lock. Data already written stays."""
        if self._lock_handle is None:
            return
        self._read_pipeline.close()
        self._write_pipeline.close()
        self.io.close(self._opened.handle)
        self.io.close(self._lock_handle)
        self._lock_handle = None

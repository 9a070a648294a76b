"""The disk tier: fixed-size page records in one preallocated file, verified on every read.

Threads: `alloc`, `free`, `invalidate`, `scan` and `close` belong to the engine thread;
`write_pages` and `read_pages` run on the mover's disk workers, any number at once, on slots
the engine allocated to them (a slot is never freed while a transfer on it is in flight).

Crash safety (process crash, kill -9; not power loss, so no fsync per write): a run of slots is
written payload first, then header; the header carries a checksum over itself and the stored
payload. A record is live only once its header is complete, a freed slot's header is zeroed,
and a torn or half-written record fails its checksum: a miss, never served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tieredkv.cache.device_pool import PageLayout
from tieredkv.cache.disk_file import (
    OpenedFile,
    lock_directory,
    open_store_file,
    prepare_directory,
    superblock_for,
)
from tieredkv.cache.disk_format import (
    CODECS,
    RecordHeader,
    chain_ok,
    decode_header,
    encode_header,
)
from tieredkv.cache.disk_io import DiskIOBackend
from tieredkv.cache.disk_pages import PageFile, lz4_block, slot_runs
from tieredkv.cache.page_key import KEY_BYTES
from tieredkv.errors import DiskStoreError, OutOfPagesError

logger = logging.getLogger(__name__)

ERROR_REASONS = ("checksum", "fingerprint", "io")
_SCAN_CHUNK_BYTES = 4 << 20
# A run of slots moves as chunks of about this size, in parallel on the store's I/O threads, so
# one chunk's checksums overlap another's transfer and several requests are in flight.
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class DiskRecord:
    """A page's identity as stored in its record header."""

    key: bytes  # 16 bytes: page_key(parent_key, tokens)
    parent_key: bytes  # 16 bytes: the parent page's key, or the namespace root key
    tokens: tuple[int, ...]  # page_size tokens


def _page_rows(pages: torch.Tensor, layout: PageLayout) -> np.ndarray:
    """A (n, page_bytes) uint8 view of a page-major CPU tensor, no copy."""
    assert pages.shape[1:] == layout.page_shape, f"{tuple(pages.shape)} vs {layout.page_shape}"
    assert pages.dtype == layout.dtype and pages.device.type == "cpu" and pages.is_contiguous()
    return pages.view(torch.uint8).numpy().reshape(pages.shape[0], layout.page_bytes)


class DiskStore:
    """Fixed-size page records under `directory`, owned by one process (exclusive flock)."""

    def __init__(
        self,
        directory: Path,
        fingerprint: bytes,
        layout: PageLayout,
        capacity_bytes: int,
        io: DiskIOBackend | None = None,
        codec: str = "raw",
        io_threads: int = 4,
    ) -> None:
        if codec not in CODECS:
            raise DiskStoreError(f"disk store codec must be one of {sorted(CODECS)}, got {codec!r}")
        if codec == "lz4":
            lz4_block()  # fail at start, with the fix in the message, if the package is missing
        self.directory = Path(directory)
        self.layout = layout
        self.codec = CODECS[codec]
        self.io = io if io is not None else DiskIOBackend()
        self.error_counts = dict.fromkeys(ERROR_REASONS, 0)
        self.degraded = False
        self._counts_lock = threading.Lock()
        wanted = superblock_for(layout, fingerprint, capacity_bytes)
        prepare_directory(self.directory)
        self._lock_handle: int | None = lock_directory(self.io, self.directory)
        try:
            opened = open_store_file(self.io, self.directory, wanted, self._count_error)
        except BaseException:
            self.io.close(self._lock_handle)
            raise
        self._opened: OpenedFile = opened
        self._file = PageFile(self.io, opened.handle, opened.superblock, layout.page_bytes)
        self.num_slots = opened.superblock.num_slots
        self.direct_io = self._file.direct_io
        self._chunk_pages = max(CHUNK_BYTES // opened.superblock.record_bytes, 1)
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="tieredkv-disk-io")
        self._free = list(range(self.num_slots - 1, -1, -1))  # pop() hands out low ids first
        self._is_free = [True] * self.num_slots
        logger.info(
            "disk store %s: %d pages of %d B, O_DIRECT %s",
            self.directory,
            self.num_slots,
            layout.page_bytes,
            "on" if self.direct_io else "off",
        )

    def _count_error(self, reason: str, count: int = 1) -> None:
        with self._counts_lock:
            self.error_counts[reason] += count

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity_bytes(self) -> int:
        return self._opened.superblock.file_bytes

    def alloc(self, count: int) -> list[int]:
        """Take `count` record slots, all or nothing (OutOfPagesError)."""
        if count > len(self._free):
            raise OutOfPagesError(f"disk store: asked for {count} pages, {len(self._free)} free")
        slots = [self._free.pop() for _ in range(count)]
        for slot in slots:
            self._is_free[slot] = False
        return slots

    def free(self, slots: list[int]) -> None:
        """Return slots and zero their headers so a restart does not bring them back. A failed
        invalidation is counted ("io") and logged: the slot's next write still cannot verify
        against the old header, because the record checksum covers the payload."""
        for slot in slots:
            assert not self._is_free[slot], f"disk slot {slot} freed twice"
        try:
            self.invalidate(slots)
        except OSError as error:
            self._count_error("io")
            self.degraded = True
            logger.warning(
                "disk store: invalidating %d freed records failed: %s", len(slots), error
            )
        for slot in slots:
            self._is_free[slot] = True
            self._free.append(slot)

    def invalidate(self, slots: list[int]) -> None:
        """Zero the headers of `slots` (their records become misses). Raises OSError."""
        ordered = sorted(slots)
        zeros = bytes(self._file.block.header_bytes)
        for start, length in slot_runs(ordered):
            self._file.write_headers(ordered[start], zeros * length)

    def write_pages(
        self, slots: list[int], records: list[DiskRecord], payload: torch.Tensor
    ) -> None:
        """Write `payload` (n, num_layers, 2, page_size, kv_heads, head_dim), the layout's dtype,
        page-major, CPU, one page per slot. Returns once every byte is written. Raises OSError
        (counted "io", store degraded); the slots' records are then misses, all others intact."""
        assert len(slots) == len(records) == payload.shape[0], "one record and page per slot"
        rows = _page_rows(payload, self.layout)  # (n, page_bytes) uint8
        try:
            for start, length in slot_runs(slots):
                headers = self._in_chunks(
                    start,
                    length,
                    lambda s, e: self._write_chunk(slots[s], records[s:e], rows[s:e]),
                )
                self._file.write_headers(slots[start], b"".join(headers))  # after the payloads
        except OSError:
            self._count_error("io")
            self.degraded = True
            raise

    def _write_chunk(self, first_slot: int, records: list[DiskRecord], rows: np.ndarray) -> bytes:
        """Encode, checksum and write one chunk's payloads; return its headers (unwritten)."""
        stored = [self._file.encode(row, self.codec) for row in rows]
        header_bytes = self._file.block.header_bytes
        headers = b"".join(
            encode_header(header_bytes, codec, r.key, r.parent_key, r.tokens, data)
            for r, (codec, data) in zip(records, stored, strict=True)
        )
        self._file.write_payloads(first_slot, rows, stored)
        return headers

    def _in_chunks(self, start: int, length: int, work: Callable[[int, int], object]) -> list:
        """Run work(chunk_start, chunk_end) over [start, start + length) on the I/O threads;
        the results in order. Waits for every chunk before raising the first error, so no I/O
        on these slots outlives the call."""
        futures: list[Future] = [
            self._pool.submit(work, chunk, min(chunk + self._chunk_pages, start + length))
            for chunk in range(start, start + length, self._chunk_pages)
        ]
        wait(futures)  # SYNC: the caller's transfer is done only when all its chunks are
        return [future.result() for future in futures]

    def read_pages(
        self, slots: list[int], expected: list[DiskRecord | bytes], out: torch.Tensor
    ) -> list[bool]:
        """Fill out[i] (same shape rules as write_pages) from slots[i]; True when the record
        verifies: header and payload checksum, key == page_key(parent_key, tokens), and key ==
        the expected record's key. False (counted "checksum") is a miss; out[i] is zeroed.
        I/O errors raise OSError (counted "io")."""
        rows = _page_rows(out, self.layout)  # (n, page_bytes) uint8
        verified: list[bool] = []
        try:
            for start, length in slot_runs(slots):
                headers = self._read_headers(slots[start], length)
                chunks = self._in_chunks(
                    start,
                    length,
                    lambda s, e, h=headers, r=start: self._file.read_payloads(
                        slots[s], h[s - r : e - r], rows[s:e]
                    ),
                )
                run_ok = [ok for chunk in chunks for ok in chunk]
                for index, (header, ok) in enumerate(zip(headers, run_ok, strict=True)):
                    want = expected[start + index]
                    want_key = want.key if isinstance(want, DiskRecord) else want
                    verified.append(ok and header is not None and header.key == want_key)
        except OSError:
            self._count_error("io")
            raise
        misses = [index for index, ok in enumerate(verified) if not ok]
        for index in misses:
            rows[index] = 0
        if misses:
            self._count_error("checksum", len(misses))
            logger.warning("disk store: %d of %d records failed to verify", len(misses), len(slots))
        return verified

    def _read_headers(self, first_slot: int, count: int) -> list[RecordHeader | None]:
        raw = self._file.read_headers(first_slot, count)
        headers = [decode_header(row, self.layout.page_size) for row in raw]
        return [h if h is not None and chain_ok(h) else None for h in headers]

    def scan(self) -> list[tuple[int, DiskRecord]]:
        """Warm restart: one sequential read of the header region. Returns every slot whose
        header verifies and whose key chains, and marks those slots used. Corrupt, torn or
        truncated-away records are counted ("checksum") and invalidated. Call once, right
        after opening, before any alloc."""
        if len(self._free) != self.num_slots:
            raise DiskStoreError("DiskStore.scan() must run before any slot is allocated")
        found: list[tuple[int, DiskRecord]] = []
        bad: list[int] = []
        per_chunk = max(_SCAN_CHUNK_BYTES // self._file.block.header_bytes, 1)
        for first in range(0, self.num_slots, per_chunk):
            raw = self._file.read_headers(first, min(per_chunk, self.num_slots - first))
            for index in np.flatnonzero(raw.any(axis=1)).tolist():
                record = self._scan_one(first + index, raw[index])
                if record is None:
                    bad.append(first + index)
                else:
                    found.append((first + index, record))
        if bad:
            self._count_error("checksum", len(bad))
            logger.warning("disk store scan: %d corrupt or torn records invalidated", len(bad))
            self.invalidate(bad)
        used = {slot for slot, _ in found}
        self._free = [slot for slot in range(self.num_slots - 1, -1, -1) if slot not in used]
        for slot in used:
            self._is_free[slot] = False
        logger.info("disk store scan: %d records found", len(found))
        return found

    def _scan_one(self, slot: int, raw: np.ndarray) -> DiskRecord | None:
        header = decode_header(raw, self.layout.page_size)
        if header is None or not chain_ok(header) or len(header.key) != KEY_BYTES:
            return None
        block = self._file.block
        payload_end = block.payload_offset + slot * block.record_bytes + header.payload_len
        if header.payload_len > block.record_bytes or payload_end > self._opened.intact_bytes:
            return None
        return DiskRecord(header.key, header.parent_key, header.tokens)

    def close(self) -> None:
        """Close the file and release the directory lock. Data already written stays."""
        if self._lock_handle is None:
            return
        self._pool.shutdown(wait=True)
        self.io.close(self._opened.handle)
        self.io.close(self._lock_handle)
        self._lock_handle = None

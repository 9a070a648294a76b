"""Batched record I/O on an open store file: headers, payloads, codecs, bounce buffers.

A run of consecutive slots moves with one system call per region (payloads, then headers).
Payloads go straight between the caller's memory and the file when the bytes are already in
the stored form and aligned for O_DIRECT; otherwise through a per-thread aligned bounce buffer.
"""

from __future__ import annotations

import threading

import numpy as np

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.format import (
    ALIGN_BYTES,
    SUPERBLOCK_BYTES,
    RecordHeader,
    Superblock,
    payload_ok,
)
from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.page_record import RAW, decode_payload, encode_payload

BOUNCE_BYTES = 8 << 20  # per thread; a chunk of records moves through it at a time


def slot_runs(slots: list[int]) -> list[tuple[int, int]]:
    """(start index, length) of each maximal run where slots[i + 1] == slots[i] + 1."""
    runs = []
    start = 0
    for index in range(1, len(slots) + 1):
        if index == len(slots) or slots[index] != slots[index - 1] + 1:
            runs.append((start, index - start))
            start = index
    return runs


class PageFile:
    """Record-level I/O for one store file. Thread-safe for disjoint slots."""

    def __init__(self, io: DiskIOBackend, handle: int, block: Superblock, page_bytes: int) -> None:
        self.io = io
        self.handle = handle
        self.block = block
        self.page_bytes = page_bytes
        self.direct_io = io.is_direct(handle)
        self._local = threading.local()

    def _bounce(self) -> np.ndarray:
        buffer = getattr(self._local, "bounce", None)
        if buffer is None:
            size = max(BOUNCE_BYTES // self.block.record_bytes, 1) * self.block.record_bytes
            buffer = self._local.bounce = aligned_empty(size)
        return buffer

    def _zero_copy(self, rows: np.ndarray) -> bool:
        """Can `rows` (k, page_bytes) move in one call without a bounce copy?"""
        if self.block.record_bytes != self.page_bytes:
            return False
        return not self.direct_io or rows.ctypes.data % ALIGN_BYTES == 0

    def read_headers(self, first_slot: int, count: int) -> np.ndarray:
        """(count, header_bytes) uint8: the stored headers of consecutive slots."""
        data = np.empty(count * self.block.header_bytes, dtype=np.uint8)
        offset = SUPERBLOCK_BYTES + first_slot * self.block.header_bytes
        self.io.pread(self.handle, offset, data.nbytes, data)
        return data.reshape(count, self.block.header_bytes)

    def write_headers(self, first_slot: int, headers: bytes) -> None:
        offset = SUPERBLOCK_BYTES + first_slot * self.block.header_bytes
        self.io.pwrite(self.handle, offset, headers)

    def _payload_offset(self, slot: int) -> int:
        return self.block.payload_offset + slot * self.block.record_bytes

    def encode(self, row: np.ndarray, codec: int) -> tuple[int, memoryview]:
        """The stored form of one page: (codec, bytes). Falls back to raw when lz4 does not
        shrink the page, so a stored payload always fits the fixed record."""
        return encode_payload(memoryview(row), codec)

    def write_payloads(
        self, first_slot: int, rows: np.ndarray, stored: list[tuple[int, memoryview]]
    ) -> None:
        """Write consecutive slots' stored payloads, `stored[i] = encode(rows[i], codec)`;
        `rows` (k, page_bytes) is written as it is when every page is stored raw."""
        if all(codec == RAW for codec, _ in stored) and self._zero_copy(rows):
            self.io.pwrite(self.handle, self._payload_offset(first_slot), rows)
            return
        bounce = self._bounce()
        record_bytes = self.block.record_bytes
        per_chunk = bounce.nbytes // record_bytes
        for chunk_start in range(0, len(stored), per_chunk):
            chunk = stored[chunk_start : chunk_start + per_chunk]
            for index, (_, view) in enumerate(chunk):
                base = index * record_bytes
                bounce[base : base + len(view)] = np.frombuffer(view, dtype=np.uint8)
            offset = self._payload_offset(first_slot + chunk_start)
            self.io.pwrite(self.handle, offset, bounce[: len(chunk) * record_bytes])

    def read_in_place(
        self, first_slot: int, headers: list[RecordHeader | None], out_rows: np.ndarray
    ) -> bool:
        """Read consecutive raw records straight into out_rows (k, page_bytes) when they can
        move without a bounce copy, and return True; the bytes are not verified yet (see
        `verify_in_place`). False: nothing was read, use `read_payloads`."""
        if not all(h is None or h.codec == RAW for h in headers) or not self._zero_copy(out_rows):
            return False
        self.io.pread(self.handle, self._payload_offset(first_slot), out_rows.nbytes, out_rows)
        return True

    def verify_in_place(self, headers: list[RecordHeader | None], rows: np.ndarray) -> list[bool]:
        """Check rows filled by `read_in_place` against their headers' record checksums."""
        return [
            h is not None and h.payload_len == self.page_bytes and payload_ok(h, row.data)
            for h, row in zip(headers, rows, strict=True)
        ]

    def read_payloads(
        self, first_slot: int, headers: list[RecordHeader | None], out_rows: np.ndarray
    ) -> list[bool]:
        """Read consecutive slots' records through the bounce buffer, decode them into out_rows
        (k, page_bytes); True where the stored bytes match their header's record checksum and
        decode to exactly one page."""
        bounce = self._bounce()
        record_bytes = self.block.record_bytes
        per_chunk = bounce.nbytes // record_bytes
        verified = []
        for chunk_start in range(0, len(headers), per_chunk):
            chunk = headers[chunk_start : chunk_start + per_chunk]
            offset = self._payload_offset(first_slot + chunk_start)
            self.io.pread(self.handle, offset, len(chunk) * record_bytes, bounce)
            for index, header in enumerate(chunk):
                base = index * record_bytes
                row = out_rows[chunk_start + index]
                verified.append(header is not None and self._decode(header, bounce[base:], row))
        return verified

    def _decode(self, header: RecordHeader, record: np.ndarray, row: np.ndarray) -> bool:
        if header.payload_len > self.block.record_bytes:
            return False
        stored = record[: header.payload_len].data
        if not payload_ok(header, stored):
            return False
        page = decode_payload(header.codec, stored, self.page_bytes)
        if page is None:
            return False
        row[:] = np.frombuffer(page, dtype=np.uint8)
        return True

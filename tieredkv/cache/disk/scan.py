"""The warm-restart scan: one sequential read of a store's header region.

A slot is live when its header verifies (header checksum), its key chains
(key == page_key(parent_key, tokens)) and its stored payload lies inside the part of the file
that survived (a truncated file loses the records past its end). The payload itself is checked
when the page is read, against the record checksum.
"""

from __future__ import annotations

import numpy as np

from tieredkv.cache.disk.format import chain_ok, decode_header
from tieredkv.cache.disk.page_file import PageFile
from tieredkv.cache.page_record import PageRecord

SCAN_CHUNK_BYTES = 4 << 20


def scan_headers(
    file: PageFile, page_size: int, intact_bytes: int
) -> tuple[list[tuple[int, PageRecord]], list[int]]:
    """(live slots with their records, slots holding a corrupt, torn or lost record), both in
    slot order. All-zero headers are free slots and appear in neither."""
    found: list[tuple[int, PageRecord]] = []
    bad: list[int] = []
    num_slots = file.block.num_slots
    per_chunk = max(SCAN_CHUNK_BYTES // file.block.header_bytes, 1)
    for first in range(0, num_slots, per_chunk):
        raw = file.read_headers(first, min(per_chunk, num_slots - first))  # (k, header_bytes)
        for index in np.flatnonzero(raw.any(axis=1)).tolist():
            record = _live_record(file, first + index, raw[index], page_size, intact_bytes)
            if record is None:
                bad.append(first + index)
            else:
                found.append((first + index, record))
    return found, bad


def _live_record(
    file: PageFile, slot: int, raw: np.ndarray, page_size: int, intact_bytes: int
) -> PageRecord | None:
    header = decode_header(raw, page_size)
    if header is None or not chain_ok(header):
        return None
    block = file.block
    payload_end = block.payload_offset + slot * block.record_bytes + header.payload_len
    if header.payload_len > block.record_bytes or payload_end > intact_bytes:
        return None
    return PageRecord(
        header.key,
        header.parent_key,
        header.tokens,
        sliding_held=header.sliding_held,
        layer=header.layer,
    )

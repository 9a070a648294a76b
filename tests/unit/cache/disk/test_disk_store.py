"""DiskStore in normal operation: round trips, verification on read, warm restart, modes."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.fault_io import FaultInjectingIO
from tests.unit.cache.disk.disk_cases import (
    CAPACITY,
    LAYOUT,
    chain,
    flip_byte,
    open_store,
    random_pages,
    read_superblock,
    same_bytes,
)
from tieredkv.cache.disk.directory import LOCK_FILE, STORE_FILE
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.format import SUPERBLOCK_BYTES, decode_header
from tieredkv.cache.disk.page_file import PageFile
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_layout import PageLayout, aligned_empty
from tieredkv.cache.page_record import CODECS, PageRecord
from tieredkv.errors import DiskStoreError, OutOfPagesError


def _stored_codec(directory: Path, slot: int) -> int:
    block = read_superblock(directory / STORE_FILE)
    data = (directory / STORE_FILE).read_bytes()
    offset = SUPERBLOCK_BYTES + slot * block.header_bytes
    header = decode_header(data[offset : offset + block.header_bytes], LAYOUT.page_size)
    assert header is not None
    return header.codec


@pytest.mark.parametrize("codec", ["raw", "lz4"])
def test_round_trip_bytes_equal(tmp_path: Path, codec: str) -> None:
    store = open_store(tmp_path, codec=codec)
    records = chain(5)
    pages = random_pages(5)
    pages[1] = 0  # compressible: lz4 stores it compressed
    slots = store.alloc(5)
    store.write_pages(slots, records, pages)
    out = torch.full_like(pages, 7.0)
    assert store.read_pages(slots, records, out) == [True] * 5
    assert same_bytes(out, pages)
    assert store.error_counts == dict.fromkeys(DiskErrorReason, 0)
    assert _stored_codec(tmp_path, slots[1]) == CODECS[codec]
    assert _stored_codec(tmp_path, slots[0]) == CODECS["raw"]  # random bf16 does not shrink
    store.close()


def test_non_consecutive_slots_and_expected_keys(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    slots = store.alloc(6)
    chosen = [slots[4], slots[0], slots[1], slots[5]]
    records, pages = chain(4), random_pages(4, seed=3)
    store.write_pages(chosen, records, pages)
    out = torch.empty_like(pages)
    assert store.read_pages(chosen, [r.key for r in records], out) == [True] * 4
    assert same_bytes(out, pages)
    store.close()


def test_page_sized_aligned_records_move_without_bounce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16 KiB page in aligned memory goes straight between the caller and the file."""
    layout = PageLayout(
        num_layers=2, num_kv_heads=1, head_dim=64, page_size=16, dtype=torch.float32
    )
    assert layout.page_bytes == 16384
    store = open_store(tmp_path, layout=layout, capacity=1 << 20)
    records, pages = chain(3, layout=layout), random_pages(3, seed=1, layout=layout)
    aligned = torch.from_numpy(aligned_empty(pages.numel() * 4)).view(torch.float32)
    aligned = aligned.view(pages.shape)
    aligned.copy_(pages)
    monkeypatch.setattr(PageFile, "_bounce", lambda self: pytest.fail("bounce buffer used"))
    slots = store.alloc(3)
    store.write_pages(slots, records, aligned)
    aligned.zero_()
    assert store.read_pages(slots, records, aligned) == [True] * 3
    assert same_bytes(aligned, pages)
    monkeypatch.undo()
    unaligned = torch.zeros_like(pages)[:, :]  # torch's allocator: 64-byte aligned only
    assert store.read_pages(slots, records, unaligned) == [True] * 3
    assert same_bytes(unaligned, pages)
    store.close()


def _written(tmp_path: Path, count: int = 3, codec: str = "raw"):
    store = open_store(tmp_path, codec=codec)
    records, pages = chain(count), random_pages(count)
    slots = store.alloc(count)
    store.write_pages(slots, records, pages)
    return store, slots, records, pages


@pytest.mark.parametrize("region", ["payload", "header"])
@pytest.mark.parametrize("codec", ["raw", "lz4"])
def test_flipped_byte_is_a_counted_miss(tmp_path: Path, region: str, codec: str) -> None:
    store, slots, records, pages = _written(tmp_path, codec=codec)
    block = read_superblock(tmp_path / STORE_FILE)
    if region == "payload":
        offset = block.payload_offset + slots[1] * block.record_bytes + 100
    else:
        offset = SUPERBLOCK_BYTES + slots[1] * block.header_bytes + 50  # inside the tokens
    flip_byte(tmp_path / STORE_FILE, offset)
    out = torch.empty_like(pages)
    assert store.read_pages(slots, records, out) == [True, False, True]
    assert store.error_counts[DiskErrorReason.CHECKSUM] == 1
    assert same_bytes(out[0], pages[0]) and same_bytes(out[2], pages[2])
    assert not out[1].view(torch.int16).any()  # the unverified bytes are not left behind
    store.close()


def test_key_that_does_not_chain_is_a_miss(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    parent = chain(1)[0].key
    liar = PageRecord(page_key(parent, (1, 1, 1, 1)), parent, (2, 2, 2, 2))
    slot = store.alloc(1)
    store.write_pages(slot, [liar], random_pages(1))
    assert store.read_pages(slot, [liar], torch.empty_like(random_pages(1))) == [False]
    assert store.error_counts[DiskErrorReason.CHECKSUM] == 1
    store.close()
    reopened = open_store(tmp_path)
    assert reopened.scan() == []
    assert reopened.error_counts[DiskErrorReason.CHECKSUM] == 1
    reopened.close()


def test_other_expected_key_is_a_miss(tmp_path: Path) -> None:
    store, slots, records, pages = _written(tmp_path)
    out = torch.empty_like(pages)
    assert store.read_pages(slots, [records[1], records[1], records[2]], out) == [False, True, True]
    assert store.error_counts[DiskErrorReason.CHECKSUM] == 1
    store.close()


def test_reopen_scan_finds_every_record(tmp_path: Path) -> None:
    store, slots, records, pages = _written(tmp_path, count=5)
    store.free([slots[2]])
    store.close()
    reopened = open_store(tmp_path)
    found = reopened.scan()
    kept = [0, 1, 3, 4]
    assert found == [(slots[i], records[i]) for i in kept]
    assert reopened.num_free == reopened.num_pages - 4
    assert slots[2] in reopened.alloc(1)  # lowest free slot again: the freed one
    out = torch.empty((4, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    assert (
        reopened.read_pages([slots[i] for i in kept], [records[i] for i in kept], out) == [True] * 4
    )
    assert same_bytes(out, pages[kept])
    with pytest.raises(DiskStoreError):
        reopened.scan()  # only right after opening
    reopened.close()


def test_alloc_is_all_or_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.num_pages == 14 and store.file_bytes <= CAPACITY
    store.alloc(10)
    with pytest.raises(OutOfPagesError):
        store.alloc(5)
    assert store.num_free == 4
    store.close()


def test_alloc_is_ascending_and_freed_slots_come_back_lowest_first(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    assert store.alloc(4) == [0, 1, 2, 3]
    store.free([3, 1, 2])
    assert store.free_list.used_pages() == [0]
    assert store.alloc(2) == [1, 2]
    with pytest.raises(AssertionError, match="freed twice"):
        store.free([3])
    store.close()


def test_second_store_on_a_locked_directory_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with pytest.raises(DiskStoreError, match="in use"):
        open_store(tmp_path)
    store.close()
    open_store(tmp_path).close()  # closing released the lock


def test_files_and_directory_modes(tmp_path: Path) -> None:
    old_umask = os.umask(0)  # the modes must not depend on the umask
    try:
        directory = tmp_path / "cache" / "disk"
        store = open_store(directory)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / STORE_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / LOCK_FILE).stat().st_mode) == 0o600
    store.close()


def test_bad_codec_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DiskStoreError, match="codec"):
        open_store(tmp_path, codec="zstd")


def test_too_small_capacity_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DiskStoreError, match="cannot hold one page"):
        open_store(tmp_path, capacity=4096)
    assert not (tmp_path / STORE_FILE).exists()


def test_scan_reads_headers_sequentially(tmp_path: Path) -> None:
    """The header region is contiguous: one read covers all headers of a small store."""
    _written(tmp_path)[0].close()
    block = read_superblock(tmp_path / STORE_FILE)
    assert block.payload_offset - SUPERBLOCK_BYTES >= block.num_slots * block.header_bytes
    headers = np.frombuffer((tmp_path / STORE_FILE).read_bytes(), dtype=np.uint8)
    region = headers[SUPERBLOCK_BYTES : SUPERBLOCK_BYTES + block.num_slots * block.header_bytes]
    assert region.reshape(block.num_slots, -1).any(axis=1).tolist() == [True] * 3 + [False] * 11


def test_concurrent_workers_on_disjoint_slots(tmp_path: Path) -> None:
    """Disk workers call write_pages / read_pages at once; every page comes back intact."""
    store = open_store(tmp_path, capacity=256 << 10)
    count = 12
    records, pages = chain(count), random_pages(count, seed=5)
    slots = store.alloc(count)
    parts = [slice(i, i + 3) for i in range(0, count, 3)]
    out = torch.empty_like(pages)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: store.write_pages(slots[p], records[p], pages[p]), parts))
        results = list(pool.map(lambda p: store.read_pages(slots[p], records[p], out[p]), parts))
    assert results == [[True] * 3] * 4
    assert same_bytes(out, pages)
    store.close()


def test_freed_slots_come_back_ascending_and_batches_move_in_runs(tmp_path: Path) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    first = store.alloc(8)
    store.free(first)
    again = store.alloc(8)
    assert again == first == list(range(8))
    writes = io.num_writes
    store.write_pages(again, chain(8), random_pages(8))
    assert io.num_writes == writes + 2  # one payload request and one header request
    store.free([again[5], again[1], again[3]])
    assert store.alloc(3) == [1, 3, 5]
    store.close()


def test_verified_chunks_are_handed_on_in_order_across_runs(tmp_path: Path) -> None:
    """`on_verified` sees every page once, in order, with the flags read_pages returns, and a
    page that fails verification is already zeroed when it is handed on."""
    store = open_store(tmp_path)
    store._min_chunk_pages = 1  # tiny pages: chunks of one or two pages
    slots = store.alloc(10)
    chosen = [slots[7], slots[8], slots[9], slots[0], slots[1], slots[4]]  # three runs
    records, pages = chain(6), random_pages(6, seed=5)
    store.write_pages(chosen, records, pages)
    block = read_superblock(tmp_path / STORE_FILE)
    flip_byte(tmp_path / STORE_FILE, block.payload_offset + chosen[4] * block.record_bytes + 9)
    out = torch.empty_like(pages)
    seen: list[tuple[int, int, list[bool], bool]] = []

    def on_verified(start: int, end: int, flags: list[bool]) -> None:
        zeroed = not out[start:end][[not ok for ok in flags]].view(torch.int16).any()
        seen.append((start, end, flags, zeroed))

    verified = store.read_pages(chosen, records, out, on_verified)
    assert verified == [True, True, True, True, False, True]
    assert [index for start, end, *_ in seen for index in range(start, end)] == list(range(6))
    assert [ok for *_, flags, _ in seen for ok in flags] == verified
    assert all(zeroed for *_, zeroed in seen) and len(seen) >= 3  # at least one per run
    assert same_bytes(out[[0, 1, 2, 3, 5]], pages[[0, 1, 2, 3, 5]])
    store.close()

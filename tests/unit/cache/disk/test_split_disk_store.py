"""The split disk store alone: a page's layers as records of their own, its sliding layers only
where it was given a sliding part; reads verify every layer they need, a warm restart finds
the pages whose full layers all survived."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.fault_io import FaultInjectingIO, SimulatedCrash
from tests.unit.cache.disk.disk_cases import FINGERPRINT, chain, flip_byte, random_pages, same_bytes
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.format import encode_header
from tieredkv.cache.disk.split_store import SplitDiskStore
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.page_record import PageRecord

# 4 layers, one full (3) and three sliding; a layer page is 128 B, a record slot 4 KiB
LAYOUT = PageLayout(num_layers=4, num_kv_heads=1, head_dim=8, page_size=4, dtype=torch.bfloat16)
PARTS = PageParts(LAYOUT, full_layers=(3,), sliding_layers=(0, 1, 2))
RECORDS = 24  # layer records: 24 pages without a sliding part, 6 with one
CAPACITY = 4096 + RECORDS * (128 + 4096) + 4096


def open_split(directory: Path, capacity: int = CAPACITY) -> SplitDiskStore:
    return SplitDiskStore(directory, FINGERPRINT, PARTS, capacity)


def held(record: PageRecord, sliding: bool) -> PageRecord:
    return PageRecord(record.key, record.parent_key, record.tokens, sliding_held=sliding)


def written(directory: Path, sliding: list[bool]) -> tuple[SplitDiskStore, list, torch.Tensor]:
    """A store with one page per entry of `sliding`, given a sliding part where True."""
    store = open_split(directory)
    pages = store.alloc(len(sliding))
    store.attach_sliding([page for page, keep in zip(pages, sliding, strict=True) if keep])
    records = [
        held(r, keep) for r, keep in zip(chain(len(sliding), layout=LAYOUT), sliding, strict=True)
    ]
    payload = random_pages(len(sliding), seed=3, layout=LAYOUT)
    store.write_pages(pages, records, payload)
    return store, list(zip(pages, records, strict=True)), payload


def read(store: SplitDiskStore, pages: list[int], records: list) -> tuple[list, torch.Tensor]:
    out = torch.full((len(pages), *LAYOUT.page_shape), 9.0, dtype=LAYOUT.dtype)
    return store.read_pages(pages, records, out), out


def test_pages_without_a_sliding_part_take_only_their_full_layers(tmp_path: Path) -> None:
    store = open_split(tmp_path)
    assert store.num_units == RECORDS and store.num_free == RECORDS  # one record a page
    pages = store.alloc(4)
    assert store.attach_sliding(pages[:2]) == pages[:2]
    assert store.num_free == RECORDS - 4 - 2 * 3  # the two sliding parts took three each
    assert store.sliding_room() == store.num_free // 3
    store.close()


def test_a_page_reads_back_its_layers_and_zeros_where_it_holds_none(tmp_path: Path) -> None:
    store, written_pages, payload = written(tmp_path, [True, False, True])
    pages = [page for page, _ in written_pages]
    flags, out = read(store, pages, [record for _, record in written_pages])
    assert flags == [True, True, True]
    assert same_bytes(out[0], payload[0]) and same_bytes(out[2], payload[2])
    assert same_bytes(out[1, 3], payload[1, 3])  # the full layer
    assert not out[1, :3].any()  # its sliding layers were never written
    store.close()


def test_a_reader_counting_on_a_sliding_part_the_page_lacks_gets_a_miss(tmp_path: Path) -> None:
    store, written_pages, _ = written(tmp_path, [False, True])
    pages = [page for page, _ in written_pages]
    wants_all = [held(record, True) for _, record in written_pages]
    flags, out = read(store, pages, wants_all)
    assert flags == [False, True] and not out[0].any()
    store.close()


def test_a_layer_record_in_another_layers_place_does_not_verify(tmp_path: Path) -> None:
    store, written_pages, payload = written(tmp_path, [True, True])
    (first, record), (second, _) = written_pages
    store.table[first, [0, 1]] = store.table[first, [1, 0]]  # the page's layers 0 and 1 swapped
    flags, out = read(store, [first, second], [record, written_pages[1][1]])
    assert flags == [False, True] and not out[0].any() and same_bytes(out[1], payload[1])
    assert store.page_errors()[DiskErrorReason.CHECKSUM] == 2
    store.close()


def test_a_corrupt_sliding_layer_fails_only_its_page(tmp_path: Path) -> None:
    store, written_pages, payload = written(tmp_path, [True, True])
    (first, record), (second, other) = written_pages
    slot = int(store.table[second, 1])
    block = store.records._file.block
    store.close()
    flip_byte(tmp_path / STORE_FILE, block.payload_offset + slot * block.record_bytes + 5)
    store = open_split(tmp_path)
    found = dict(store.scan())
    assert set(found) == {first, second} and found[second].sliding_held  # headers intact
    flags, out = read(store, [first, second], [record, other])
    assert flags == [True, False] and same_bytes(out[0], payload[0]) and not out[1].any()
    store.close()


def test_a_warm_restart_finds_each_page_with_the_layers_it_kept(tmp_path: Path) -> None:
    store, written_pages, payload = written(tmp_path, [True, False, True, True])
    pages = [page for page, _ in written_pages]
    store.detach_sliding([pages[3]])  # its sliding records go (their headers zeroed)
    store.records.invalidate([int(store.table[pages[2], 3])])  # page 2 loses its full layer
    store.close()
    store = open_split(tmp_path)
    found = store.scan()
    by_key = {record.key: (page, record) for page, record in found}
    keys = [record.key for _, record in written_pages]
    assert set(by_key) == {keys[0], keys[1], keys[3]}  # page 2 is gone, with all its records
    assert [by_key[keys[i]][1].sliding_held for i in (0, 1, 3)] == [True, False, False]
    assert store.num_free == RECORDS - (4 + 1 + 1)  # page 2's three sliding records were freed
    new_pages = [by_key[keys[i]][0] for i in (0, 1, 3)]
    flags, out = read(store, new_pages, [by_key[keys[i]][1] for i in (0, 1, 3)])
    assert flags == [True, True, True] and same_bytes(out[0], payload[0])
    assert same_bytes(out[2, 3], payload[3, 3]) and not out[2, :3].any()
    store.close()


def test_a_sliding_part_missing_a_layer_is_found_without_it(tmp_path: Path) -> None:
    store, written_pages, _ = written(tmp_path, [True])
    ((page, record),) = written_pages
    store.records.invalidate([int(store.table[page, 1])])  # a crash between its layers' writes
    store.close()
    store = open_split(tmp_path)
    ((found_page, found),) = store.scan()
    assert found.key == record.key and not found.sliding_held
    assert store.num_free == RECORDS - 1 and found_page not in store.sliding_of
    store.close()


def test_freed_pages_leave_nothing_a_restart_finds(tmp_path: Path) -> None:
    store, written_pages, _ = written(tmp_path, [True, False])
    store.free([page for page, _ in written_pages])
    assert store.num_free == RECORDS
    store.close()
    store = open_split(tmp_path)
    assert store.scan() == []
    store.close()


@pytest.mark.parametrize("first_split", [True, False])
def test_whole_page_and_layer_record_stores_set_each_other_aside(
    tmp_path: Path, first_split: bool
) -> None:
    def whole() -> DiskStore:
        return DiskStore(tmp_path, FINGERPRINT, LAYOUT, CAPACITY, parts=PARTS.describe())

    first = open_split(tmp_path) if first_split else whole()
    first.close()
    second = whole() if first_split else open_split(tmp_path)
    assert second.page_errors()[DiskErrorReason.FINGERPRINT] == 1
    assert list(tmp_path.glob(f"{STORE_FILE}.setaside-*"))
    second.close()


def test_a_layer_record_naming_its_page_with_other_tokens_does_not_verify(tmp_path: Path) -> None:
    """Each layer record's key must chain from its own parent and tokens, even beside records
    of the same page that do (the chain check is hashed once per name, not once per key)."""
    store, written_pages, _ = written(tmp_path, [True])
    ((page, record),) = written_pages
    slot = int(store.table[page, 1])
    file = store.records._file
    block = file.block
    payload = (tmp_path / STORE_FILE).read_bytes()[
        block.payload_offset + slot * block.record_bytes :
    ][: PARTS.layer_page_bytes]
    forged = tuple(token + 1 for token in record.tokens)
    header = encode_header(
        block.header_bytes, 0, record.key, record.parent_key, forged, memoryview(payload), layer=1
    )
    file.write_headers(slot, header)
    flags, out = read(store, [page], [record])
    assert flags == [False] and not out.any()
    store.close()


def test_a_crash_at_any_write_leaves_only_pages_that_read_back_verified(tmp_path: Path) -> None:
    """kill -9 after each possible number of writes of a batch (a page's full and sliding
    layers are separate runs of slots, each written payload first, then headers): a restart
    finds only pages whose found layers all verify, with the bytes that were written."""
    payload = random_pages(3, seed=5, layout=LAYOUT)
    records = chain(3, layout=LAYOUT)
    writes = None
    crash_at = cut = 0
    while writes is None or crash_at <= writes:
        directory = tmp_path / f"crash-{crash_at}"
        io = FaultInjectingIO(direct_io=False)
        store = SplitDiskStore(directory, FINGERPRINT, PARTS, CAPACITY, io=io)
        pages = store.alloc(3)
        filler = store.alloc(1)
        store.attach_sliding(pages[::2])
        store.free(filler)  # a free slot between the full layers and the sliding ones
        before = io.num_writes
        io.crash_after_writes(crash_at)
        try:
            store.write_pages(
                pages,
                [held(r, p in pages[::2]) for r, p in zip(records, pages, strict=True)],
                payload,
            )
            writes = io.num_writes - before  # no crash: every write of the batch was done
            store.close()
        except SimulatedCrash:
            pass
        store = open_split(directory)
        found = store.scan()
        by_key = {record.key: (page, record) for page, record in found}
        for index, record in enumerate(records):
            if record.key not in by_key:
                continue
            page, kept = by_key[record.key]
            flags, out = read(store, [page], [kept])
            assert flags == [True], crash_at
            cut += index != 1 and not kept.sliding_held  # written with its sliding layers
            layers = list(range(4)) if kept.sliding_held else [3]
            assert same_bytes(out[0, layers], payload[index, layers]), crash_at
        if writes is not None and crash_at == writes:
            assert len(found) == 3  # the batch that did not crash is all there
        store.close()
        crash_at += 1
    assert writes is not None and writes >= 4  # payloads and headers of several runs
    assert cut  # some crash found a page's full layers without its sliding ones

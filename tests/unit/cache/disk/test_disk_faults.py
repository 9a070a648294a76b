"""DiskStore under injected faults: crashes mid-batch, torn writes, full/read-only/failing disks."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from tests.support.fault_io import FaultInjectingIO, SimulatedCrash
from tests.unit.cache.disk.disk_cases import (
    CAPACITY,
    FINGERPRINT,
    LAYOUT,
    chain,
    open_store,
    random_pages,
    same_bytes,
)
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.store import DiskStore


def _reopened_contents(directory: Path, pages_by_slot: dict[int, torch.Tensor]):
    """Reopen with a plain backend; return (scan result, which scanned records read back equal)."""
    store = open_store(directory)
    found = store.scan()
    slots = [slot for slot, _ in found]
    out = torch.empty((len(slots), *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    verified = store.read_pages(slots, [record for _, record in found], out)
    equal = [same_bytes(out[i], pages_by_slot[slot]) for i, slot in enumerate(slots)]
    counts = dict(store.error_counts)
    store.close()
    return found, verified, equal, counts


@pytest.mark.parametrize("writes_before_crash", range(9))
def test_crash_after_n_writes_keeps_exactly_the_completed_records(
    tmp_path: Path, writes_before_crash: int
) -> None:
    """Batches over runs of slots: each run is one payload write then one header write."""
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(8)
    records, pages = chain(8), random_pages(8)
    batches = [[0, 1], [2], [4, 5, 7], [3, 6]]  # indexes; [4, 5, 7] is two runs
    io.crash_after_writes(writes_before_crash)
    completed: list[int] = []
    with pytest.raises(SimulatedCrash):
        for batch in batches:
            store.write_pages([slots[i] for i in batch], [records[i] for i in batch], pages[batch])
            completed += batch
    assert io.crashed
    with pytest.raises(SimulatedCrash):  # a dead process does no more I/O
        store.write_pages(slots[:1], records[:1], pages[:1])
    found, verified, equal, _ = _reopened_contents(tmp_path, dict(zip(slots, pages, strict=True)))
    live = {slot for slot, _ in found}
    # a run whose header write completed is live even if its batch then crashed
    runs_done = {1: [], 2: [0, 1], 3: [0, 1], 4: [0, 1, 2], 5: [0, 1, 2], 6: [0, 1, 2, 4, 5]}
    runs_done |= {7: [0, 1, 2, 4, 5], 8: [0, 1, 2, 4, 5, 7]}
    expected_live = set(runs_done.get(writes_before_crash, []))
    assert live == {slots[i] for i in expected_live}
    assert set(completed) <= expected_live
    assert all(verified) and all(equal)
    assert [record for slot, record in found] == [records[slots.index(s)] for s in sorted(live)]


@pytest.mark.parametrize("keep_bytes", [1, 100, 4095, 4096 + 50])
def test_torn_payload_write_never_verifies(tmp_path: Path, keep_bytes: int) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(3)
    records, pages = chain(3), random_pages(3)
    store.write_pages(slots[:1], records[:1], pages[:1])
    io.tear_write(keep_bytes)  # the payload write of the next two-page run
    with pytest.raises(SimulatedCrash):
        store.write_pages(slots[1:], records[1:], pages[1:])
    found, verified, equal, counts = _reopened_contents(
        tmp_path, dict(zip(slots, pages, strict=True))
    )
    assert found == [(slots[0], records[0])] and verified == [True] and equal == [True]
    assert counts[DiskErrorReason.CHECKSUM] == 0


@pytest.mark.parametrize("keep_bytes", [1, 60, 79, 80, 127, 128 + 79])
def test_torn_header_write_never_verifies(tmp_path: Path, keep_bytes: int) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(2)
    records, pages = chain(2), random_pages(2)
    io.tear_write(keep_bytes, after=1)  # the header write of the two-page run
    with pytest.raises(SimulatedCrash):
        store.write_pages(slots, records, pages)
    found, verified, equal, counts = _reopened_contents(
        tmp_path, dict(zip(slots, pages, strict=True))
    )
    # Headers are 128 B; their fields (checksums last) end at 80 B, the rest is zero padding.
    expected = [(slots[0], records[0])] if keep_bytes >= 80 else []
    assert found == expected and all(verified) and all(equal)
    torn = int(0 < keep_bytes < 80) + int(128 < keep_bytes < 128 + 80)
    assert counts[DiskErrorReason.CHECKSUM] == torn  # a torn header: counted, invalidated


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EIO])
@pytest.mark.parametrize("which", ["payload", "header"])
def test_failing_write_raises_and_keeps_earlier_records(
    tmp_path: Path, code: int, which: str
) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(4)
    records, pages = chain(4), random_pages(4)
    store.write_pages(slots[:2], records[:2], pages[:2])
    io.fail_write(code, after=0 if which == "payload" else 1)
    with pytest.raises(OSError) as caught:
        store.write_pages(slots[2:], records[2:], pages[2:])
    assert caught.value.errno == code
    assert store.degraded and store.error_counts[DiskErrorReason.IO] == 1
    out = torch.empty_like(pages)
    assert store.read_pages(slots, records, out) == [True, True, False, False]
    assert same_bytes(out[:2], pages[:2])
    store.free(slots[2:])  # the caller frees the failed destination
    store.close()
    found, verified, _, _ = _reopened_contents(tmp_path, dict(zip(slots, pages, strict=True)))
    assert found == [(slots[0], records[0]), (slots[1], records[1])] and all(verified)


def test_failing_read_raises_and_is_counted(tmp_path: Path) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(2)
    store.write_pages(slots, chain(2), random_pages(2))
    io.fail_read(errno.EIO, after=1)  # the payload read, after the header read
    with pytest.raises(OSError):
        store.read_pages(slots, chain(2), torch.empty_like(random_pages(2)))
    assert store.error_counts[DiskErrorReason.IO] == 1
    out = torch.empty_like(random_pages(2))
    assert store.read_pages(slots, chain(2), out) == [True, True]  # the fault was one-off
    store.close()


def test_failed_invalidation_on_free_is_counted_not_raised(tmp_path: Path) -> None:
    io = FaultInjectingIO()
    store = open_store(tmp_path, io=io)
    slots = store.alloc(2)
    store.write_pages(slots, chain(2), random_pages(2))
    io.fail_write(errno.EROFS)
    store.free(slots[:1])
    assert store.error_counts[DiskErrorReason.IO] == 1 and store.degraded
    assert store.num_free == store.num_pages - 1
    store.close()


def test_failed_chunk_of_a_long_run_leaves_no_record_of_that_run(tmp_path: Path) -> None:
    """A run moves as pipelined chunks; its headers are written only once every chunk is."""
    io = FaultInjectingIO()
    store = DiskStore(tmp_path, FINGERPRINT, LAYOUT, CAPACITY, io=io, chunk_bytes=3 * 4096)
    slots = store.alloc(12)
    records, pages = chain(12), random_pages(12)
    store.write_pages(slots[:2], records[:2], pages[:2])
    writes_before = io.num_writes
    io.fail_write(errno.EIO, after=1)  # one of the 4 chunk writes of the next run
    with pytest.raises(OSError):
        store.write_pages(slots[2:12], records[2:12], pages[2:12])
    # the pipeline stops soon after the failed chunk (which chunk drew the fault depends on
    # thread timing) and never writes the run's headers
    assert writes_before + 2 <= io.num_writes <= writes_before + 4
    out = torch.empty_like(pages)
    assert store.read_pages(slots, records, out) == [True] * 2 + [False] * 10
    store.write_pages(slots[2:12], records[2:12], pages[2:12])  # a retry succeeds
    assert store.read_pages(slots, records, out) == [True] * 12
    assert same_bytes(out, pages)
    store.close()

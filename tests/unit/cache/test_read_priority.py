"""Reads before writes on the disk store: a write chunk waits while a read is in flight (a read
serves a request waiting for it), never longer than the gate's bound; a read never queues behind
writes on the store's I/O threads; and the disk I/O workers start with their staging buffers
already faulted in."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.unit.cache.disk.disk_cases import (
    CAPACITY,
    FINGERPRINT,
    LAYOUT,
    chain,
    open_store,
    random_pages,
    same_bytes,
)
from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.read_priority import ReadPriority
from tieredkv.cache.transfer.executors import ThreadTransferExecutor


def test_a_write_waits_for_a_read_in_flight_then_lands(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    records, pages = chain(3), random_pages(3)
    slots = store.alloc(3)
    store.read_priority.max_wait_s = 30.0  # the read below ends well before this
    wrote = threading.Event()

    def write() -> None:
        store.write_pages(slots, records, pages)
        wrote.set()

    with store.read_priority.reading():  # a request's read is in flight
        writer = threading.Thread(target=write)
        writer.start()
        assert not wrote.wait(0.3)  # held back while the read lasts
    assert wrote.wait(10)
    writer.join()
    assert store.read_priority.writes_deferred >= 1
    out = random_pages(3) * 0
    assert store.read_pages(slots, records, out) == [True] * 3
    assert same_bytes(out, pages)
    store.close()


class _HeldWrites(DiskIOBackend):
    """Payload writes on the store's I/O threads block until `release` is set (a slow disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.held = threading.Semaphore(0)  # one count per write that is blocked

    def pwrite(self, handle: int, offset: int, data) -> None:
        if threading.current_thread().name.startswith("tieredkv-disk"):
            self.held.release()
            assert self.release.wait(30), "the test never let the writes go"
        super().pwrite(handle, offset, data)


def test_a_read_does_not_queue_behind_writes_already_on_the_io_threads(tmp_path: Path) -> None:
    """Two write-throughs whose chunks all reached the I/O threads before a request's read
    began: the read still gets threads of its own (with threads shared, the writes below hold
    all four and the read waits for them)."""
    io = _HeldWrites()
    store = DiskStore(tmp_path, FINGERPRINT, LAYOUT, CAPACITY, io=io, chunk_bytes=4096)
    store.read_priority.max_wait_s = 0.05
    records, pages = chain(3, namespace="read"), random_pages(3, seed=1)
    read_slots = store.alloc(3)
    io.release.set()
    store.write_pages(read_slots, records, pages)
    io.release.clear()
    writers = []
    for index in range(2):  # four one-page chunks each: more than all I/O threads together
        slots, writes = store.alloc(4), chain(4, namespace=f"write-{index}")
        writer = threading.Thread(
            target=store.write_pages, args=(slots, writes, random_pages(4, seed=2 + index))
        )
        writer.start()
        writers.append((writer, slots, writes))
    try:
        for _ in range(2):
            assert io.held.acquire(timeout=10)  # writes are blocked on I/O threads
        out = random_pages(3) * 0
        result: list[list[bool]] = []
        reader = threading.Thread(
            target=lambda: result.append(store.read_pages(read_slots, records, out)), daemon=True
        )
        reader.start()
        reader.join(10)
        assert result == [[True] * 3], "the read waited for the blocked writes"
        assert same_bytes(out, pages)
    finally:
        io.release.set()
        for writer, *_ in writers:
            writer.join(30)
    for index, (_, slots, writes) in enumerate(writers):  # and every write landed
        back = random_pages(4) * 0
        assert store.read_pages(slots, writes, back) == [True] * 4
        assert same_bytes(back, random_pages(4, seed=2 + index))
    store.close()


def test_a_write_waits_no_longer_than_the_bound() -> None:
    gate = ReadPriority(max_wait_s=0.05)
    with gate.reading():
        started = time.monotonic()
        gate.before_write()  # a read that never ends does not starve writes
        assert time.monotonic() - started >= 0.05
    gate.before_write()  # no read: no wait
    assert gate.writes_deferred == 1


def test_io_workers_all_start_warm_before_the_first_job() -> None:
    warmed: set[int] = set()
    lock = threading.Lock()

    def warm() -> None:
        with lock:
            warmed.add(threading.get_ident())

    executor = ThreadTransferExecutor(num_workers=4, name="test-io", warm=warm)
    try:
        assert len(warmed) == 4  # one per worker thread, all before any job was submitted
    finally:
        executor.shutdown()

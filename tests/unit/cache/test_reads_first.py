"""Reads before writes on the disk store: a write chunk waits while a read is in flight (a read
serves a request waiting for it), never longer than the gate's bound; and the disk I/O workers
start with their staging buffers already faulted in."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from disk_cases import chain, open_store, random_pages, same_bytes

from tieredkv.cache.reads_first import ReadsFirst
from tieredkv.cache.transfer.executor import ThreadTransferExecutor


def test_a_write_waits_for_a_read_in_flight_then_lands(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    records, pages = chain(3), random_pages(3)
    slots = store.alloc(3)
    store.reads_first.max_wait_s = 30.0  # the read below ends well before this
    wrote = threading.Event()

    def write() -> None:
        store.write_pages(slots, records, pages)
        wrote.set()

    with store.reads_first.reading():  # a request's read is in flight
        writer = threading.Thread(target=write)
        writer.start()
        assert not wrote.wait(0.3)  # held back while the read lasts
    assert wrote.wait(10)
    writer.join()
    assert store.reads_first.writes_deferred >= 1
    out = random_pages(3) * 0
    assert store.read_pages(slots, records, out) == [True] * 3
    assert same_bytes(out, pages)
    store.close()


def test_a_write_waits_no_longer_than_the_bound() -> None:
    gate = ReadsFirst(max_wait_s=0.05)
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

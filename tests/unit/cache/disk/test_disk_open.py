"""Opening a disk store directory: mismatches set aside, truncation, foreign files, space,
locking across processes, O_DIRECT fallback."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

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
from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.directory import SET_ASIDE_INFIX, STORE_FILE
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.page_layout import PageLayout
from tieredkv.errors import DiskStoreError

TESTS_DIR = Path(__file__).parent


def _write_three(directory: Path, **kwargs) -> None:
    store = open_store(directory, **kwargs)
    store.write_pages(store.alloc(3), chain(3), random_pages(3))
    store.close()


@pytest.mark.parametrize(
    "change",
    [
        {"fingerprint": b"another-model"},
        {"layout": PageLayout(2, 1, 8, 8, torch.bfloat16)},  # page size 8
        {"layout": PageLayout(2, 1, 8, 4, torch.float32)},  # dtype
        {"layout": PageLayout(3, 1, 8, 4, torch.bfloat16)},  # layers
        {"capacity": CAPACITY // 2},  # fewer pages than the file holds
    ],
)
def test_foreign_store_is_set_aside(tmp_path: Path, change: dict) -> None:
    _write_three(tmp_path)
    original = (tmp_path / STORE_FILE).read_bytes()
    store = open_store(tmp_path, **change)
    counted = {**dict.fromkeys(DiskErrorReason, 0), DiskErrorReason.FINGERPRINT: 1}
    assert store.error_counts == counted
    assert store.scan() == []
    aside = tmp_path / (STORE_FILE + SET_ASIDE_INFIX + "fingerprint")
    assert aside.read_bytes() == original  # renamed, not deleted, not modified
    store.close()


def test_larger_capacity_keeps_the_existing_store(tmp_path: Path) -> None:
    _write_three(tmp_path)
    store = open_store(tmp_path, capacity=CAPACITY * 4)
    assert store.num_pages == 14  # kept as it was; nothing set aside
    assert [slot for slot, _ in store.scan()] == [0, 1, 2]
    assert store.error_counts[DiskErrorReason.FINGERPRINT] == 0
    store.close()


def test_corrupt_superblock_is_set_aside_as_checksum(tmp_path: Path, caplog) -> None:
    _write_three(tmp_path)
    flip_byte(tmp_path / STORE_FILE, 30)
    with caplog.at_level(logging.WARNING):
        store = open_store(tmp_path)
    assert store.error_counts[DiskErrorReason.CHECKSUM] == 1
    assert store.error_counts[DiskErrorReason.FINGERPRINT] == 0
    assert (tmp_path / (STORE_FILE + SET_ASIDE_INFIX + "checksum")).exists()
    assert "set aside" in caplog.text
    assert store.scan() == []
    store.close()


def test_truncated_store_loses_only_the_cut_records(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    slots = store.alloc(5)
    records, pages = chain(5), random_pages(5)
    store.write_pages(slots, records, pages)
    store.close()
    block = read_superblock(tmp_path / STORE_FILE)
    block_end = block.payload_offset + 2 * block.record_bytes + 100
    os.truncate(tmp_path / STORE_FILE, block_end)  # record 2's payload is cut short
    reopened = open_store(tmp_path)
    found = reopened.scan()
    assert found == [(slots[0], records[0]), (slots[1], records[1])]
    assert reopened.error_counts[DiskErrorReason.CHECKSUM] == 3
    out = torch.empty_like(pages[:2])
    assert reopened.read_pages(slots[:2], records[:2], out) == [True, True]
    assert same_bytes(out, pages[:2])
    reopened.close()


def test_store_truncated_inside_the_superblock_is_set_aside(tmp_path: Path) -> None:
    _write_three(tmp_path)
    os.truncate(tmp_path / STORE_FILE, 100)
    store = open_store(tmp_path)
    assert store.error_counts[DiskErrorReason.CHECKSUM] == 1
    assert store.scan() == []
    store.close()


def test_foreign_file_is_logged_and_left_alone(tmp_path: Path, caplog) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING):
        open_store(tmp_path).close()
    assert "notes.txt" in caplog.text
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_no_space_at_start_shrinks_the_store(tmp_path: Path, caplog) -> None:
    io = FaultInjectingIO(max_file_bytes=20 << 10)
    with caplog.at_level(logging.WARNING):
        store = open_store(tmp_path, io=io)
    assert 0 < store.num_pages < 14 and store.file_bytes <= 20 << 10
    assert "no space" in caplog.text
    store.write_pages(store.alloc(1), chain(1), random_pages(1))
    store.close()


def test_no_space_for_any_page_raises(tmp_path: Path) -> None:
    with pytest.raises(DiskStoreError, match="no space"):
        open_store(tmp_path, io=FaultInjectingIO(max_file_bytes=4096))
    assert not (tmp_path / STORE_FILE).exists()


def _accepts_o_direct(directory: Path) -> bool:
    """Whether `directory`'s filesystem opens a file with O_DIRECT, asked without the store."""
    probe = directory / f".o-direct-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return False
    finally:
        probe.unlink(missing_ok=True)
    os.close(fd)
    return True


def _payload_calls_direct(store: DiskStore, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Write four pages and read them back; for each 4 KiB-aligned system call (the payloads),
    whether the descriptor it went through had O_DIRECT set at the time of the call."""
    seen: list[bool] = []
    real_pwrite, real_preadv = os.pwrite, os.preadv

    def note(fd: int, offset: int, nbytes: int) -> None:
        if offset % 4096 == 0 and nbytes > 0 and nbytes % 4096 == 0:
            seen.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT))

    def pwrite(fd: int, data, offset: int) -> int:
        note(fd, offset, memoryview(data).nbytes)
        return real_pwrite(fd, data, offset)

    def preadv(fd: int, buffers: list, offset: int) -> int:
        note(fd, offset, sum(memoryview(b).nbytes for b in buffers))
        return real_preadv(fd, buffers, offset)

    records, pages = chain(4), random_pages(4)
    slots = store.alloc(4)
    out = torch.empty_like(pages)
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", pwrite)
        patch.setattr(os, "preadv", preadv)
        store.write_pages(slots, records, pages)
        assert store.read_pages(slots, records, out) == [True] * 4
    assert same_bytes(out, pages)
    return seen


@pytest.mark.parametrize("io", [FaultInjectingIO(refuse_direct=True), DiskIOBackend(False)])
def test_buffered_fallback_when_o_direct_is_refused(
    tmp_path: Path, io: DiskIOBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path, io=io)
    assert not store.direct_io
    seen = _payload_calls_direct(store, monkeypatch)
    assert seen and not any(seen)  # every payload went through the page cache
    store.close()


def _disk_directory() -> Path:
    """A directory on a disk filesystem (not tmpfs) whose O_DIRECT opens succeed."""
    for candidate in (Path("/var/tmp"), TESTS_DIR):
        if candidate.is_dir() and os.access(candidate, os.W_OK) and _accepts_o_direct(candidate):
            return candidate
    pytest.skip("no writable directory here accepts O_DIRECT")


def test_o_direct_is_in_effect_where_the_filesystem_allows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tempfile.TemporaryDirectory(dir=_disk_directory(), prefix="tieredkv-o-direct-") as name:
        store = open_store(Path(name))
        assert store.direct_io
        seen = _payload_calls_direct(store, monkeypatch)
        assert seen and all(seen)  # every payload write and read bypassed the page cache
        store.close()


def test_o_direct_is_reported_as_the_filesystem_decides_on_tmpfs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since; either way the store's
    report and its descriptors follow what the filesystem says to an independent open."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm")
    allowed = _accepts_o_direct(shm)
    with tempfile.TemporaryDirectory(dir=shm, prefix="tieredkv-o-direct-") as name:
        store = open_store(Path(name))
        assert store.direct_io == allowed
        seen = _payload_calls_direct(store, monkeypatch)
        assert seen and all(direct == allowed for direct in seen)
        store.close()


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )


def test_lock_holds_against_another_process_and_a_killed_owner_releases_it(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path)
    refused = _python(
        f"""
        from pathlib import Path
        from disk_cases import open_store
        from tieredkv.errors import DiskStoreError
        try:
            open_store(Path({str(tmp_path)!r}))
        except DiskStoreError as error:
            print("refused:", error)
        """
    )
    assert "refused:" in refused.stdout and "in use" in refused.stdout, refused.stderr
    store.close()
    killed = _python(
        f"""
        import os, signal
        from pathlib import Path
        from disk_cases import chain, open_store, random_pages
        store = open_store(Path({str(tmp_path)!r}))
        store.write_pages(store.alloc(4), chain(4), random_pages(4))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    reopened = open_store(tmp_path)  # the dead owner's lock is gone; its records survive
    assert [record for _, record in reopened.scan()] == chain(4)
    out = torch.empty((4, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    assert reopened.read_pages([0, 1, 2, 3], chain(4), out) == [True] * 4
    assert same_bytes(out, random_pages(4))
    reopened.close()

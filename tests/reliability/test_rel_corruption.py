"""Corruption: a store with flipped bytes, a truncated store, a store written for another model,
a file that is no store at all, and foreign files beside it. Each restart must turn what it
finds into misses (counted in disk_page_errors_total by reason), log what it found, and answer
every chat exactly like a --no-cache server."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.harness import (
    COMMON,
    TINY_TIERS,
    Baseline,
    FaultServer,
    StoreScan,
    assert_answers_like_baseline,
    disk_args,
    disk_read_bytes,
    flip_bytes,
    opening,
    reachable_from_prompt_start,
    scan_store,
)
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.format import SUPERBLOCK_BYTES, decode_superblock

SEEDS = range(5)
IM_START = 1
FOREIGN = b"not a tieredkv file\n"


@pytest.fixture(scope="module")
def prepared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by a server that served SEEDS and shut down cleanly."""
    root = tmp_path_factory.mktemp("prepared")
    disk = root / "kv"
    server = FaultServer([*COMMON, *TINY_TIERS, *disk_args(disk)], root / "prepare.log")
    try:
        for seed in SEEDS:
            server.chat(opening(seed))
    finally:
        server.stop()
    assert server.process.returncode == 0
    return disk


def _payload_offset(scan: StoreScan, slot: int) -> int:
    return scan.payload_offset + slot * scan.record_bytes


def flip_records(disk: Path, scan: StoreScan) -> dict[str, int]:
    """Flip a payload byte in two reachable records and a header byte in a third; add a foreign
    file beside the store. Returns the errors the restart must count at start."""
    reachable = sorted(reachable_from_prompt_start(scan, IM_START))
    assert len(reachable) >= 3, reachable
    for slot in reachable[1:3]:
        flip_bytes(disk / STORE_FILE, _payload_offset(scan, slot) + 1000)
    flip_bytes(disk / STORE_FILE, SUPERBLOCK_BYTES + reachable[-1] * scan.header_bytes + 40)
    (disk / "notes.txt").write_bytes(FOREIGN)
    return {"checksum": 1, "fingerprint": 0}


def truncate(disk: Path, scan: StoreScan) -> dict[str, int]:
    """Cut the file inside the payload of its last records."""
    slots = sorted(scan.live)
    keep = slots[len(slots) // 2]
    os.truncate(disk / STORE_FILE, _payload_offset(scan, keep) + 100)
    return {"checksum": len(slots) - slots.index(keep), "fingerprint": 0}


def other_model(disk: Path, scan: StoreScan) -> dict[str, int]:
    """Re-seal the superblock as written for another model (a valid one, other fingerprint)."""
    with open(disk / STORE_FILE, "r+b") as file:
        block = decode_superblock(file.read(SUPERBLOCK_BYTES))
        other = dataclasses.replace(block, fingerprint_digest=bytes(32))
        file.seek(0)
        file.write(other.encode())
    return {"checksum": 0, "fingerprint": 1}


def not_a_store(disk: Path, scan: StoreScan) -> dict[str, int]:
    """A foreign file where the store should be."""
    (disk / STORE_FILE).write_bytes(FOREIGN * 1000)
    return {"checksum": 1, "fingerprint": 0}


CASES: dict[str, tuple[Callable[[Path, StoreScan], dict[str, int]], str]] = {
    "flipped-bytes": (flip_records, "1 corrupt or torn records invalidated"),
    "truncated": (truncate, "is truncated to"),
    "other-model": (other_model, "set aside as pages-0.tkv.setaside-fingerprint"),
    "not-a-store": (not_a_store, "set aside as pages-0.tkv.setaside-checksum"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_store_gives_misses_and_right_answers(
    tmp_path: Path, prepared_store: Path, baseline: Baseline, case: str
) -> None:
    disk = tmp_path / "kv"
    shutil.copytree(prepared_store, disk)
    scan = scan_store(disk)
    assert scan.live and not scan.bad_headers and not scan.bad_payloads
    corrupt, log_line = CASES[case]
    at_start = corrupt(disk, scan)
    args = [*COMMON, *TINY_TIERS, *disk_args(disk), "--debug-endpoints"]
    server = FaultServer(args, tmp_path / "restart.log")
    try:
        assert log_line in server.full_log()
        before = server.metrics()
        for reason, count in at_start.items():
            assert before[f'disk_page_errors_total{{reason="{reason}"}}'] == count, reason
        assert_answers_like_baseline(server, baseline, [opening(s) for s in SEEDS])
        after = server.metrics()
        state = server.debug_cache()
        assert state["ok"], state["problems"]
        assert server.health()[0] == 200
    finally:
        server.stop()
    if case == "flipped-bytes":  # the flipped payloads were read, refused and counted
        assert after['disk_page_errors_total{reason="checksum"}'] >= 2
        assert "records failed to verify" in server.full_log()
        assert (disk / "notes.txt").read_bytes() == FOREIGN  # logged, left alone
        assert "ignoring foreign file 'notes.txt'" in server.full_log()
    if case in ("other-model", "not-a-store"):  # nothing of the set-aside file is used
        assert before['tier_used_bytes{tier="disk"}'] == 0
        assert "warm restart: 0 disk pages indexed" in server.full_log()
    else:  # the intact records are indexed and still serve
        assert before['tier_used_bytes{tier="disk"}'] > 0
        assert disk_read_bytes(after) > 0

"""Crash and restart: the server is killed (-9) while it demotes pages to disk, then restarted
on the same directory. It must find again exactly the records whose writes completed, refuse
torn ones, and answer every chat exactly like a --no-cache server."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import (
    COMMON,
    PAGE_BYTES,
    TINY_TIERS,
    Baseline,
    FaultServer,
    StoreScan,
    assert_answers_like_baseline,
    disk_args,
    disk_read_bytes,
    opening,
    reachable_from_prompt_start,
    scan_store,
    slots_from_write_log,
    wait_until,
)

IM_START = 1  # the chat template's first token: a prompt's first page starts with it
RESTART_LINE = re.compile(r"warm restart: (\d+) disk pages indexed, (\d+) duplicates and (\d+)")


def chat_until_dead(server: FaultServer, seeds: range) -> list[list[dict]]:
    """Chats, one after another, until the server dies; returns what was sent."""
    sent: list[list[dict]] = []
    try:
        for seed in seeds:
            sent.append(opening(seed))
            server.chat(sent[-1])
    except httpx.TransportError:
        return sent
    raise AssertionError("the server survived the injected crash")


def restart_and_check(
    tmp_path: Path, disk: Path, scan: StoreScan, sent: list[list[dict]], baseline: Baseline
) -> float:
    """Restart on `disk`: the index holds exactly the verified records, torn ones are counted,
    and every chat answers like the no-cache server. Returns the bytes read from disk."""
    args = [*COMMON, *TINY_TIERS, *disk_args(disk), "--debug-endpoints"]
    server = FaultServer(args, tmp_path / "restart.log")
    try:
        found = RESTART_LINE.search(server.full_log())
        assert found, server.log()
        indexed, duplicates, unreachable = map(int, found.groups())
        assert indexed + duplicates + unreachable == len(scan.live)
        metrics = server.metrics()
        assert metrics['tier_used_bytes{tier="disk"}'] == indexed * PAGE_BYTES
        assert metrics['disk_page_errors_total{reason="checksum"}'] == len(scan.bad_headers)
        assert_answers_like_baseline(server, baseline, sent)
        read_back = disk_read_bytes(server.metrics())
        state = server.debug_cache()
        assert state["ok"], state["problems"]
        assert state["locked_nodes"] == 0
    finally:
        server.stop()
    return read_back


@pytest.mark.parametrize(
    ("fault", "torn_headers"),
    [
        ({"tear_header": [6, 100]}, 1),
        pytest.param({"tear_payload": [12, 4096 + 7]}, 0, marks=pytest.mark.slow),
    ],
    ids=["torn-header-write", "torn-payload-write"],
)
def test_crash_mid_demotion_keeps_exactly_the_completed_records(
    tmp_path: Path, baseline: Baseline, fault: dict, torn_headers: int
) -> None:
    disk, write_log = tmp_path / "kv", tmp_path / "header-writes.log"
    args = [*COMMON, *TINY_TIERS, *disk_args(disk)]
    server = FaultServer(args, tmp_path / "crash.log", {**fault, "write_log": str(write_log)})
    sent = chat_until_dead(server, range(12))
    assert server.wait_dead() == -signal.SIGKILL
    scan = scan_store(disk)
    completed, in_flight = slots_from_write_log(write_log, scan)
    assert completed, "no record write completed before the crash"
    # every completed write is there; nothing else but writes the kill interrupted
    assert completed <= set(scan.live) <= completed | in_flight
    assert scan.bad_payloads == []  # a header is written after its payload
    assert len(scan.bad_headers) == torn_headers
    reachable = reachable_from_prompt_start(scan, IM_START)
    read_back = restart_and_check(tmp_path, disk, scan, sent, baseline)
    assert read_back > 0 or not reachable  # the records found again were served


def load(server: FaultServer, seed: int, stop: threading.Event, sent: list) -> None:
    while not stop.is_set():
        messages = opening(seed)
        sent.append(messages)
        try:
            server.chat(messages, max_tokens=4)
        except (httpx.TransportError, AssertionError):
            return
        seed += 100


@pytest.mark.slow
@pytest.mark.parametrize("disk_bytes_before_kill", [8 * PAGE_BYTES, 40 * PAGE_BYTES])
def test_kill9_under_concurrent_load(
    tmp_path: Path, baseline: Baseline, disk_bytes_before_kill: int
) -> None:
    """A real kill -9 at an arbitrary moment while four clients push pages to disk."""
    disk = tmp_path / "kv"
    server = FaultServer([*COMMON, *TINY_TIERS, *disk_args(disk)], tmp_path / "crash.log")
    stop, sent = threading.Event(), []
    clients = [threading.Thread(target=load, args=(server, s, stop, sent)) for s in range(4)]
    for client in clients:
        client.start()
    written = 'transfer_bytes_total{from_tier="host",to_tier="disk"}'
    assert wait_until(lambda: server.metrics()[written] >= disk_bytes_before_kill, 300)
    server.kill()
    stop.set()
    for client in clients:
        client.join()
    scan = scan_store(disk)
    assert scan.bad_payloads == []
    restart_and_check(tmp_path, disk, scan, sent, baseline)

"""Disk trouble while serving: writes failing with ENOSPC, EROFS or EIO, reads failing with EIO,
and a store that cannot be preallocated at its configured size. The disk tier degrades (or
starts smaller) and says so in the metrics, the log and /health; requests keep succeeding,
answered exactly like a --no-cache server."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.reliability.harness import (
    COMMON,
    TINY_TIERS,
    Baseline,
    FaultServer,
    answer,
    cached_by_tier,
    disk_args,
    disk_read_bytes,
    opening,
)

SEEDS = range(5)


def serve_chats(server: FaultServer, baseline: Baseline) -> dict[str, int]:
    """Each seed's chat, then the first ones again (their pages went down the tiers); every
    answer equals the no-cache one. Returns cached tokens per tier over the repeats."""
    for seed in SEEDS:
        assert answer(server.chat(opening(seed))) == baseline.answer(opening(seed))
    totals = {"device": 0, "host": 0, "disk": 0, "remote": 0}
    for seed in (0, 1, 4):
        reply = server.chat(opening(seed))
        assert answer(reply) == baseline.answer(opening(seed))
        for tier, tokens in cached_by_tier(reply).items():
            totals[tier] += tokens
    return totals


@pytest.mark.parametrize(
    "code",
    [
        errno.ENOSPC,
        # the same code path with another errno: under `make test-slow`
        pytest.param(errno.EROFS, marks=pytest.mark.slow),
        pytest.param(errno.EIO, marks=pytest.mark.slow),
    ],
    ids=errno.errorcode.get,
)
def test_failing_disk_writes_degrade_the_disk_tier(
    tmp_path: Path, baseline: Baseline, code: int
) -> None:
    faults = {"fail_write": [[code, 1]]}  # the second write while serving fails
    args = [*COMMON, *TINY_TIERS, *disk_args(tmp_path / "kv"), "--debug-endpoints"]
    server = FaultServer(args, tmp_path / "server.log", faults)
    try:
        totals = serve_chats(server, baseline)
        status, health = server.health()
        metrics = server.metrics()
        state = server.debug_cache()
    finally:
        server.stop()
    assert status == 200 and health["tiers"] == {
        "device": "healthy",
        "host": "healthy",
        "disk": "degraded",
        "remote": "disabled",
    }
    assert metrics['disk_page_errors_total{reason="io"}'] >= 1
    assert metrics['evicted_pages_total{tier="host",action="dropped"}'] > 0  # no disk below
    assert totals["device"] + totals["host"] > 0  # disk: only records written before
    assert state["ok"], state["problems"]
    log = server.full_log()
    assert "disk tier degraded (write failed:" in log
    assert f"{errno.errorcode[code]}" in log or f"[Errno {code}]" in log


def test_small_disk_and_failing_reads(tmp_path: Path, baseline: Baseline) -> None:
    """The store cannot be preallocated at 128 MiB (ENOSPC above 40 MiB): it starts at 32 MiB.
    Then the first disk read fails with EIO: that promotion is a miss, the next succeeds."""
    faults = {"max_file_bytes": 40 << 20, "fail_read": [[errno.EIO, 0]]}
    args = [*COMMON, *TINY_TIERS, *disk_args(tmp_path / "kv", "128MiB"), "--debug-endpoints"]
    server = FaultServer(args, tmp_path / "server.log", faults)
    try:
        capacity = server.metrics()['tier_capacity_bytes{tier="disk"}']
        serve_chats(server, baseline)
        status, health = server.health()
        metrics = server.metrics()
        state = server.debug_cache()
    finally:
        server.stop()
    assert 0 < capacity <= 32 << 20
    log = server.full_log()
    assert "no space for a 134213632-byte disk store" in log
    assert status == 200 and health["tiers"]["disk"] == "healthy"
    assert health["tier_capacity_bytes"]["disk"] == capacity  # /health says it started smaller
    assert metrics['disk_page_errors_total{reason="io"}'] == 1  # the injected read
    assert disk_read_bytes(metrics) > 0  # the reads after the failed one served from disk
    assert state["ok"], state["problems"]

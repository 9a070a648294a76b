"""Flush generations in the tiered cache: a tenant's flush after a restart reaches the disk
pages the restart indexed under roots no request named yet (all its salts too, and no other
tenant's), an admin's flush reaches every namespace, and both hold across the next restart
(`generations.json`, mode 0600, naming no tenant)."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.flush_generations import GENERATIONS_FILE, FlushGenerations
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import WritePolicy
from tieredkv.tenants import tenant_namespace

LAYOUT = tiny_layout(page_size=4)
TOKENS = list(range(50, 59))  # two full pages and a token
ALICE = (tenant_namespace("alice"), tenant_namespace("alice", "salt"))
BOB = tenant_namespace("bob")


def open_cache(disk_dir: Path) -> tuple[TieredCache, ManualTransferExecutor]:
    return make_cache(LAYOUT, 8, 8, 32, disk_dir, write_policy=WritePolicy.WRITE_THROUGH)


def matched_on_disk(cache: TieredCache, namespace: str) -> int:
    match = cache.match(TOKENS, namespace)
    assert match.matched_len == match.disk.num_pages * LAYOUT.page_size  # nothing above disk
    return match.matched_len


def test_a_tenants_flush_after_a_restart_forgets_its_disk_pages(tmp_path: Path) -> None:
    cache, executor = open_cache(tmp_path)
    for namespace in (*ALICE, BOB):
        compute(cache, TOKENS, namespace)
    settle(cache, executor)
    cache.close()
    cache, _ = open_cache(tmp_path)
    assert cache.flush(tenant="alice") == 0  # no request named alice's roots yet
    ok(cache)
    assert [matched_on_disk(cache, namespace) for namespace in ALICE] == [0, 0]
    assert matched_on_disk(cache, BOB) == 8
    cache.close()
    path = tmp_path / GENERATIONS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "alice" not in path.read_text()
    cache, _ = open_cache(tmp_path)
    assert [matched_on_disk(cache, namespace) for namespace in ALICE] == [0, 0]
    assert matched_on_disk(cache, BOB) == 8
    compute(cache, TOKENS, ALICE[0])  # the tenant goes on in its next generation
    assert cache.match(TOKENS, ALICE[0]).matched_len == 8
    cache.flush()  # an admin's: every namespace
    assert [cache.match(TOKENS, ns).matched_len for ns in (*ALICE, BOB, "default")] == [0] * 4
    ok(cache)
    cache.close()
    cache, _ = open_cache(tmp_path)
    assert [cache.match(TOKENS, ns).matched_len for ns in (*ALICE, BOB)] == [0] * 3
    cache.close()


def test_generations_adopt_the_shared_ones_ahead_and_report_their_own() -> None:
    generations = FlushGenerations()
    assert generations.of(ALICE[1]) == (0, 0)
    assert generations.advance("alice") == 1
    assert generations.of(ALICE[1]) == generations.of(ALICE[0]) == (0, 1)
    assert generations.of(BOB) == (0, 0)
    shared = FlushGenerations()
    shared.advance(None)
    shared.advance(None)
    everyone = dict(shared.adopt({}))  # what it would share: its global generation
    ahead = generations.adopt(everyone)
    assert generations.of(BOB) == (2, 0) and generations.of(ALICE[0]) == (2, 1)
    assert list(ahead.values()) == [1]  # alice's flush, which the other has not seen


def test_a_flushed_pin_lets_its_pages_go_and_is_pinned_again_in_the_new_generation(
    tmp_path: Path,
) -> None:
    cache, executor = make_cache(LAYOUT, 8, 8, 32, tmp_path)
    for namespace in (ALICE[0], BOB):
        compute(cache, TOKENS, namespace)
        assert cache.pin(TOKENS, namespace) is not None
    settle(cache, executor)
    assert cache.flush(tenant="alice") == 6  # the pin let go: 2 pages on device, host, disk
    ok(cache)
    flushed, kept = cache.pins.get(ALICE[0], TOKENS), cache.pins.get(BOB, TOKENS)
    assert flushed is not None and flushed.node is None and cache.pins.waiting() == [flushed]
    assert kept is not None and kept.node is not None  # another tenant's pin holds
    assert cache.match(TOKENS, ALICE[0]).matched_len == 0
    assert cache.pin(TOKENS, ALICE[0]) is None  # pinned again once computed again
    compute(cache, TOKENS, ALICE[0])
    again = cache.pin(TOKENS, ALICE[0])
    assert again is flushed and again.node is not None
    assert cache.match(TOKENS, ALICE[0]).matched_len == 8
    assert cache.unpin(TOKENS, ALICE[0]) and cache.unpin(TOKENS, BOB)
    ok(cache)
    cache.close()

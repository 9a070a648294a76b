"""Pinned prefixes in the cache: their pages stay on host (and disk) whatever else fills the
tiers, a pin needs its pages in the tree and a host tier, counts against its namespace's
budget, is released by unpin, and is read back from pins.json after a restart."""

import os
import stat
from pathlib import Path

import pytest

from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.pins import PinError
from tieredkv.cache.tier import Tier
from tieredkv.tenants import tenant_namespace

LAYOUT = tiny_layout(page_size=4)
PINNED = list(range(1000, 1009))  # 2 full pages and one token


def flood(cache, executor, count: int, start: int = 0) -> None:
    """Compute `count` unrelated 3-page prompts: LRU alone would push everything older out."""
    for i in range(start, start + count):
        for _ in range(4):  # demotions start; their room opens once they land
            if cache.device_pool.num_free >= 3:
                break
            cache.evict(Tier.DEVICE, 3)
            settle(cache, executor)
        compute(cache, list(range(10 * i, 10 * i + 12)))
        settle(cache, executor)


def tiers_of(cache, tokens: list[int]) -> dict[Tier, int]:
    match = cache.match([*tokens, 0])
    return {t: n for t, n in match.tokens_by_tier().items() if n}


def test_a_pinned_prefix_stays_on_host_under_pressure(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=6, host_pages=8, disk_pages=64, disk_dir=tmp_path
    )
    compute(cache, PINNED)
    pin = cache.pin(PINNED, "default")
    assert pin is not None and pin.num_pages == 2
    settle(cache, executor)
    flood(cache, executor, 8)
    ok(cache)
    assert sum(tiers_of(cache, PINNED).get(t, 0) for t in (Tier.DEVICE, Tier.HOST)) == 8
    assert Tier.DISK not in tiers_of(cache, PINNED)
    node = pin.node
    assert Tier.HOST in node.residence.copies and Tier.DISK in node.residence.copies
    # unpinned, it is an LRU page like any other: the next flood pushes it off host
    assert cache.unpin(PINNED, "default")
    flood(cache, executor, 8, start=20)
    assert Tier.HOST not in tiers_of(cache, PINNED)
    assert not cache.unpin(PINNED, "default")  # nothing left to unpin


def test_pin_needs_its_pages_a_host_tier_and_budget(tmp_path: Path) -> None:
    no_host, _ = make_cache(LAYOUT, device_pages=8)
    compute(no_host, PINNED)
    with pytest.raises(PinError) as error:
        no_host.pin(PINNED, "default")
    assert error.value.code == "no_host"
    cache, executor = make_cache(LAYOUT, device_pages=16, host_pages=16)  # budget: 4 pages
    assert cache.pin(PINNED, "default") is None  # not computed: the caller computes it first
    with pytest.raises(PinError) as error:
        cache.pin([1, 2, 3], "default")
    assert error.value.code == "prompt_too_short"
    compute(cache, PINNED)
    assert cache.pin(PINNED, "default").num_pages == 2
    assert cache.pin(PINNED, "default").num_pages == 2  # again: the same pin, not a second
    other = list(range(2000, 2012))  # 3 pages: 2 + 3 > 4
    compute(cache, other)
    with pytest.raises(PinError) as error:
        cache.pin(other, "default")
    assert error.value.code == "pin_budget_exceeded"
    compute(cache, other, namespace="tenant-b")
    assert cache.pin(other, "tenant-b").num_pages == 3  # each namespace has its own budget
    settle(cache, executor)


def test_pins_are_saved_beside_the_disk_store_and_read_back(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=8, host_pages=16, disk_pages=64, disk_dir=tmp_path
    )
    compute(cache, PINNED, namespace="\0tenant\0acme")
    assert cache.pin(PINNED, "\0tenant\0acme") is not None
    settle(cache, executor)
    cache.close()
    again, executor = make_cache(
        LAYOUT, device_pages=8, host_pages=16, disk_pages=64, disk_dir=tmp_path
    )
    waiting = again.pins.waiting()
    assert [(p.namespace, p.token_ids) for p in waiting] == [("\0tenant\0acme", tuple(PINNED))]
    # its pages came back from disk with the index: pinning again finds them there
    assert again.match([*PINNED, 0], "\0tenant\0acme").disk.num_pages == 2
    assert again.unpin(PINNED, "\0tenant\0acme")
    again.close()
    assert not (tmp_path / "pins.json").read_text().count("acme")


def test_a_tenants_namespaces_share_its_budget_and_all_pins_share_a_total() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=32, host_pages=16)  # 4 each, 8 in all
    salted = [tenant_namespace("acme", salt) for salt in ("s1", "s2", "s3")]
    for namespace in salted:
        compute(cache, PINNED, namespace=namespace)
    assert cache.pin(PINNED, salted[0]).num_pages == 2
    assert cache.pin(PINNED, salted[1]).num_pages == 2
    with pytest.raises(PinError) as error:  # a third salt: still acme's budget
        cache.pin(PINNED, salted[2])
    assert error.value.code == "pin_budget_exceeded"
    assert cache.pins.usage(salted[0])["owner_pinned_pages"] == 4
    compute(cache, PINNED, namespace=tenant_namespace("bob"))
    assert cache.pin(PINNED, tenant_namespace("bob")).num_pages == 2  # another tenant's own
    three_pages = list(range(3000, 3012))
    compute(cache, three_pages, namespace="shared")
    with pytest.raises(PinError) as error:  # 6 pinned, 3 more: past the total of 8
        cache.pin(three_pages, "shared")
    assert error.value.code == "pin_total_budget_exceeded"
    assert cache.pins.total_pages() == 6
    assert cache.unpin(PINNED, salted[0])
    assert cache.pin(PINNED, salted[2]).num_pages == 2  # room again in acme's budget
    settle(cache, executor)
    ok(cache)


def test_pins_json_is_private_whatever_the_umask(tmp_path: Path) -> None:
    (tmp_path / "pins.json").write_text("[]")
    os.chmod(tmp_path / "pins.json", 0o644)  # a copy others may read, as it may be found
    old_umask = os.umask(0)
    try:
        cache, executor = make_cache(
            LAYOUT, device_pages=8, host_pages=16, disk_pages=64, disk_dir=tmp_path
        )
        assert stat.S_IMODE((tmp_path / "pins.json").stat().st_mode) == 0o600
        compute(cache, PINNED, namespace=tenant_namespace("acme"))
        assert cache.pin(PINNED, tenant_namespace("acme")) is not None
        settle(cache, executor)
        cache.close()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "pins.json").stat().st_mode) == 0o600
    assert "acme" in (tmp_path / "pins.json").read_text()

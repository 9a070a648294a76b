"""Fair tenants: a namespace above its share of the device or host tier gives
up its pages first; LRU within it; plain LRU when no namespace is above its share, or when the
share is 1.0 (fairness off)."""

from __future__ import annotations

import pytest

from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.errors import ConfigError

LAYOUT = tiny_layout(page_size=4)
PS = LAYOUT.page_size


def prompt(first: int, num_pages: int) -> list[int]:
    """`num_pages` full pages of distinct tokens, plus one token (a request's last position)."""
    return list(range(first, first + num_pages * PS + 1))


def held(cache, tokens: list[int], namespace: str, *tiers: Tier) -> int:
    """Pages of `tokens` that `namespace` holds in any of `tiers` (on the matched path)."""
    match = cache.match(tokens, namespace)
    nodes = [*match.device.nodes, *match.host.nodes, *match.disk.nodes]
    return sum(node.num_pages for node in nodes if any(t in node.residence.copies for t in tiers))


@pytest.mark.parametrize(("share", "quiet_kept"), [(None, 2), (1.0, 0)])
def test_a_namespace_above_its_device_share_gives_up_pages_first(
    share: float | None, quiet_kept: int
) -> None:
    cache, _ = make_cache(LAYOUT, device_pages=12, namespace_share=share)
    quiet, flood = prompt(0, 2), prompt(1000, 8)
    compute(cache, quiet, "quiet")  # the older pages
    compute(cache, flood, "flood")  # 8 of 12 pages: above an equal share of 6
    assert cache.evict(Tier.DEVICE, 4)  # 2 free: 2 pages must go
    ok(cache)
    # fair: the flood's 2 oldest pages leave; plain LRU: the quiet tenant's 2 older pages
    assert held(cache, quiet, "quiet", Tier.DEVICE) == quiet_kept
    assert held(cache, flood, "flood", Tier.DEVICE) == 8 - quiet_kept
    pages = cache.namespace_pages()  # what GET /debug/cache shows
    assert pages["flood"] == {"device": 8 - quiet_kept}  # the only tier enabled
    assert pages.get("quiet", {"device": 0})["device"] == quiet_kept  # gone when it holds none


@pytest.mark.parametrize("policy", list(WritePolicy))
@pytest.mark.parametrize(("share", "quiet_kept"), [(None, 3 * 2), (1.0, 0)])
def test_device_and_host_keep_quiet_histories_while_one_tenant_floods(
    share: float | None, quiet_kept: int, policy: WritePolicy
) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=8, host_pages=12, write_policy=policy, namespace_share=share
    )
    chats = {f"chat{i}": prompt(100 * i, 2) for i in range(3)}
    for name, tokens in chats.items():
        compute(cache, tokens, name)
    for i in range(6):  # unique 4-page prompts, newer than every chat
        while not cache.evict(Tier.DEVICE, 4):  # demotions to host free the room when applied
            settle(cache, executor)
        compute(cache, prompt(10_000 + 100 * i, 4), "flood")
        settle(cache, executor)
    kept = sum(held(cache, tokens, name, Tier.DEVICE, Tier.HOST) for name, tokens in chats.items())
    # fair: the flood holds more than an equal part of each tier, so its pages leave first and
    # the chats (2 pages each) stay. Plain LRU: the chats are the oldest, so they left.
    assert kept == quiet_kept


def test_an_optional_copy_beyond_its_share_takes_no_room_from_namespaces_under_theirs() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=8, host_pages=8, namespace_share=None)
    chats = {name: prompt(100 * i, 3) for i, name in enumerate(("a", "b"))}
    for name, tokens in chats.items():
        compute(cache, tokens, name)
    while not cache.evict(Tier.DEVICE, 8):  # both chats to host only: 6 of its 8 pages
        settle(cache, executor)
    flood = prompt(5000, 6)
    compute(cache, flood, "flood")  # 6 device pages; a host copy would need 4 of the chats'
    node = cache.match(flood, "flood").last_node
    assert not cache.demoter.make_room(Tier.HOST, 6, claimant=node.root_key)  # 6 > 8 / 3
    assert cache.demoter.make_room(Tier.HOST, 2, claimant=node.root_key)  # free room is free
    assert all(held(cache, t, name, Tier.HOST) == 3 for name, t in chats.items())
    assert cache.demoter.make_room(Tier.HOST, 4)  # room for a request is never refused
    ok(cache)


def test_pages_on_their_way_to_a_tier_count_toward_the_claimants_share() -> None:
    # the server's race (CI, stop 23): a flood's demotions to host still in flight held most
    # of the host, but only committed pages counted, so its next claim looked within its share
    # and plain LRU took a chat's host pages for it
    cache, executor = make_cache(LAYOUT, device_pages=8, host_pages=12, namespace_share=None)
    chats = {name: prompt(100 * i, 3) for i, name in enumerate(("a", "b"))}
    for name, tokens in chats.items():
        compute(cache, tokens, name)
    while not cache.evict(Tier.DEVICE, 8):  # both chats to host only: 6 of its 12 pages
        settle(cache, executor)
    first, second = prompt(5000, 6), prompt(7000, 2)
    compute(cache, first, "flood")
    flooding = cache.match(first, "flood").last_node
    assert cache.demoter.copy_down(flooding, Tier.HOST, frees_source=False)  # 6 pages, in flight
    assert cache.pools.num_free(Tier.HOST) == 0
    compute(cache, second, "flood")
    node = cache.match(second, "flood").last_node
    # the flood would hold 8 of 12 host pages, above an equal share of 4 each: refused
    assert not cache.demoter.make_room(Tier.HOST, 2, claimant=node.root_key)
    assert all(held(cache, t, name, Tier.HOST) == 3 for name, t in chats.items())
    settle(cache, executor)
    assert held(cache, first, "flood", Tier.HOST) == 6
    ok(cache)


def test_a_namespace_further_above_its_share_gives_room_to_a_claim_beyond_share() -> None:
    cache, executor = make_cache(LAYOUT, device_pages=12, host_pages=12, namespace_share=None)
    big = prompt(0, 10)
    compute(cache, big, "big")
    while not cache.evict(Tier.DEVICE, 12):  # big on host only: 10 of 12, its share is 6
        settle(cache, executor)
    other = prompt(5000, 8)
    compute(cache, other, "other")
    node = cache.match(other, "other").last_node
    # other would hold 8 (2 above its share), big holds 4 above: big gives the 6 pages
    assert cache.demoter.make_room(Tier.HOST, 8, claimant=node.root_key)
    assert held(cache, big, "big", Tier.HOST) == 4
    ok(cache)


def test_lru_order_across_namespaces_when_none_is_above_its_share() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=12, namespace_share=None)
    a, b = prompt(0, 3), prompt(1000, 3)
    compute(cache, a, "a")  # the older
    compute(cache, b, "b")
    assert cache.evict(Tier.DEVICE, 8)  # 6 free: two more pages must go; each holds 3 of 6
    assert held(cache, a, "a", Tier.DEVICE) == 1  # a's last pages were the least recent
    assert held(cache, b, "b", Tier.DEVICE) == 3


def test_a_fixed_fraction_is_each_namespaces_share() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=16, namespace_share=0.5)
    small, big = prompt(0, 3), prompt(1000, 9)
    compute(cache, big, "big")  # the older: plain LRU would take these first either way
    compute(cache, small, "small")
    cache.match(big, "big")  # now the most recent
    assert cache.evict(Tier.DEVICE, 6)  # 4 free: 2 must go, from "big" (9 > 8 of 16)
    assert held(cache, small, "small", Tier.DEVICE) == 3
    assert held(cache, big, "big", Tier.DEVICE) == 7


def test_locked_pages_of_a_namespace_above_its_share_leave_room_to_others() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=12, namespace_share=None)
    quiet, flood = prompt(0, 2), prompt(1000, 8)
    compute(cache, quiet, "quiet")
    compute(cache, flood, "flood")
    match = cache.match(flood, "flood")
    cache.lock(match.last_node)  # the flood's pages are in use: they cannot leave
    assert cache.evict(Tier.DEVICE, 4)  # so the quiet tenant's go, rather than nothing
    assert held(cache, quiet, "quiet", Tier.DEVICE) == 0
    cache.unlock(match.last_node)
    ok(cache)


def test_the_integrity_check_counts_each_namespaces_pages() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    compute(cache, prompt(0, 3), "a")
    root = next(iter(cache.tree.roots.values()))
    assert root.residence.usage[Tier.DEVICE] == 3
    root.residence.usage[Tier.DEVICE] += 1  # a count that drifted from the copies
    result = cache.check_integrity()
    assert not result.ok and any("namespace pages per tier" in p for p in result.problems)
    root.residence.usage[Tier.DEVICE] -= 1
    root.residence.arriving[Tier.DEVICE] += 1  # pages counted on their way with no copy in flight
    result = cache.check_integrity()
    assert not result.ok and any("namespace pages arriving" in p for p in result.problems)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ConfigError, match="namespace_share"):
        CacheConfig(namespace_share=share)

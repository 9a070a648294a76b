"""The split host pool's sliding parts kept in step with the tree: the rule over the tree's
shape (a node in the middle of a path keeps nothing for its own end), parts no reuse point reads
any more taken back, the least recently used copies evicted whole when the arena is full, and
the arena holding as many pages as whole pages where every page keeps its part and more where
few do, while every match stays cut where a window would read a missing part."""

from __future__ import annotations

from tests.support.tiny_cache import make_cache
from tests.unit.cache.cache_steps import compute, ok, settle
from tests.unit.cache.test_sliding_gaps import LAYOUT, WINDOW, model
from tieredkv.cache.index.page_key import namespace_root_key, token_bytes
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES, tree_kept_sliding
from tieredkv.cache.tier import Tier
from tieredkv.config import WritePolicy

PS = 4
# window 9 reads 8 tokens before a reuse point; with the margin, 16 tokens: 4 pages
assert WINDOW - 1 + REUSE_MARGIN_PAGES * PS == 16


def test_the_rule_follows_the_trees_shape() -> None:
    tree = RadixTree(PS, Residence.for_root)
    root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
    node = tree.add_child(root, token_bytes(range(10 * PS)))
    assert tree_kept_sliding(node, WINDOW, PS).tolist() == [False] * 6 + [True] * 4  # a leaf
    child = tree.add_child(node, token_bytes(range(500, 500 + PS)))
    # the middle of a path: only what its child's end reaches back to (16 - 4 tokens)
    assert tree_kept_sliding(node, WINDOW, PS).tolist() == [False] * 7 + [True] * 3
    grandchild = tree.add_child(child, token_bytes(range(600, 600 + 5 * PS)))
    assert tree_kept_sliding(node, WINDOW, PS).tolist() == [False] * 10  # 20 tokens further
    assert tree_kept_sliding(child, WINDOW, PS).tolist() == [False]
    assert tree_kept_sliding(grandchild, WINDOW, PS).tolist() == [False] + [True] * 4
    tree.add_child(node, token_bytes(range(700, 700 + 8 * PS)))  # a branch: a reuse point
    assert tree_kept_sliding(node, WINDOW, PS).tolist() == [False] * 6 + [True] * 4
    short = tree.add_child(root, token_bytes(range(900, 900 + 2 * PS)))
    assert tree_kept_sliding(short, WINDOW, PS).tolist() == [True, True]


def split_cache(host_pages: int = 40):
    """Write-through into a split host pool: the bytes of `host_pages` whole pages, two layer
    pages each (the tiny model: one sliding layer, one full)."""
    cache, executor = make_cache(
        LAYOUT, device_pages=32, host_pages=host_pages, model=model(WINDOW), split_host=True,
        write_policy=WritePolicy.WRITE_THROUGH,
    )  # fmt: skip
    host = cache.pools.host
    assert isinstance(host, SplitHostPool) and Tier.HOST in cache.demoter.transfers.sliding_rooms
    assert host.num_units == 2 * host_pages
    return cache, executor, host


def history(first: int, num_tokens: int = 40) -> list[int]:
    return list(range(first, first + num_tokens))


def test_parts_an_extended_path_no_longer_reads_are_taken_back() -> None:
    cache, executor, host = split_cache()
    turn1 = history(100)
    compute(cache, turn1)
    settle(cache, executor)
    assert host.num_sliding_held == 4  # the leaf's last 16 tokens
    turn2 = [*turn1, *history(300, 40)]
    compute(cache, turn2)
    settle(cache, executor)
    assert host.num_sliding_held == 8  # each copy was a leaf when written
    room = cache.demoter.transfers.sliding_rooms[Tier.HOST]
    assert room.reclaim() == 4  # turn 1's end is the middle of the path now
    assert host.num_sliding_held == 4
    assert host.used_bytes == (20 + 4) * host.unit_bytes  # 20 pages, 4 with their part
    ok(cache)
    cache.evict(Tier.DEVICE, 32)  # host copies serve from here on
    settle(cache, executor)
    assert cache.match([*turn2, 1]).matched_len == 80  # the path's end kept its window
    assert cache.match([*turn2[:40], 7, 7]).matched_len == 0  # turn 1's end: cut
    ok(cache)


def test_the_arena_holds_whole_pages_within_a_window_and_more_beyond() -> None:
    cache, executor, _ = split_cache(host_pages=20)
    for chat in range(12):  # 2 pages each, within one window: every page keeps its part
        compute(cache, history(1000 * (chat + 1), 8))
        settle(cache, executor)
    assert cache.tier_parts_held(Tier.HOST) == (20, 20)  # as many as whole pages
    ok(cache)
    cache, executor, _ = split_cache(host_pages=35)  # 70 layer pages, 35 whole pages
    for chat in range(5):  # 10 pages each, 4 of them in the window before the end
        compute(cache, history(1000 * (chat + 1)))
        settle(cache, executor)
    assert cache.tier_parts_held(Tier.HOST) == (50, 20)  # five chats where 3.5 fit whole
    ok(cache)


def host_copy(cache, chat: list[int]):
    node = cache.match([*chat, 1]).last_node
    return node.residence.copies.get(Tier.HOST), node.residence.sliding_gaps.get(Tier.HOST)


def test_a_full_arena_evicts_the_least_recently_used_copies_whole() -> None:
    cache, executor, host = split_cache(host_pages=20)  # 40 layer pages: 14 a chat
    chats = [history(1000 * (i + 1)) for i in range(3)]
    for chat in chats[:2]:
        compute(cache, chat)
        settle(cache, executor)
    cache.match([*chats[0], 1])  # chat 0 used again: chat 1 is now the oldest
    compute(cache, chats[2])
    settle(cache, executor)
    assert host_copy(cache, chats[1])[0] is None  # evicted whole
    for chat in (chats[0], chats[2]):
        pages, gaps = host_copy(cache, chat)
        assert len(pages) == 10 and gaps == frozenset(range(6))  # its window kept
    assert host.num_sliding_held == 8
    ok(cache)


def test_a_copy_that_finds_no_room_lacks_the_parts_and_its_match_is_cut() -> None:
    cache, executor, _ = split_cache(host_pages=34)  # 68 layer pages: four chats and 12
    chats = [history(1000 * (i + 1)) for i in range(4)]
    for chat in chats:
        compute(cache, chat)
        settle(cache, executor)
    cache.evict(Tier.DEVICE, 32)
    settle(cache, executor)
    locked = [cache.match([*chat, 1]).last_node for chat in chats]
    for node in locked:  # every host copy is being read by a request
        cache.lock(node)
    compute(cache, history(9000))  # room for its full parts and two sliding ones
    settle(cache, executor)
    node = cache.match([*history(9000), 1]).last_node
    assert node.residence.sliding_gaps[Tier.HOST] == frozenset({0, 1, 2, 3, 4, 5, 8, 9})
    for node in locked:
        cache.unlock(node)
    cache.evict(Tier.DEVICE, 32)
    settle(cache, executor)
    # its window lacks parts: cut back to the last boundary whose window has them
    assert cache.match([*history(9000), 1]).matched_len == 32
    assert cache.match([*chats[0], 1]).matched_len == 40
    ok(cache)

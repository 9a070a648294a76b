"""Page keys are computed when a page first needs one, and stay true through splits and merges."""

import random
from pathlib import Path

from tests.support.tiny_cache import FINGERPRINT, make_cache, tiny_layout
from tieredkv.cache.index.page_key import chain_keys, namespace_root_key, token_bytes
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.residency.node_transfers import page_records
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier

PS = 4
LAYOUT = tiny_layout(PS)


def test_insert_computes_no_key_and_a_disk_write_computes_the_path(tmp_path: Path) -> None:
    cache, executor = make_cache(
        LAYOUT, device_pages=16, host_pages=16, disk_pages=16, disk_dir=tmp_path
    )
    tokens = list(range(24))
    pages = cache.allocate(6)
    assert pages is not None
    shared = cache.insert(tokens[:12], "ns", pages[:3]).node
    leaf = cache.insert(tokens, "ns", pages).node
    assert shared is not None and leaf is not None and leaf.parent is shared
    assert shared.keys == leaf.keys == []
    root = namespace_root_key(FINGERPRINT, "ns")
    assert cache.demoter.copy_down(leaf, Tier.DISK, frees_source=False)  # the ancestor first
    assert shared.keys + leaf.keys == chain_keys(root, tokens, PS)
    records = page_records(leaf, cache.tree)
    assert [r.key for r in records] == chain_keys(root, tokens, PS)[3:]
    assert records[0].parent_key == shared.keys[-1]
    assert [r.tokens for r in records] == [tuple(tokens[i : i + PS]) for i in range(12, 24, PS)]
    executor.complete_all()
    cache.poll()
    assert Tier.DISK in leaf.residence.copies and cache.check_integrity().ok
    cache.close()


def test_keys_known_in_part_survive_splits_and_merges() -> None:
    tree = RadixTree(PS, Residence.for_root)
    root_key = namespace_root_key(b"fp", "ns")
    root = tree.root(root_key, create=True)
    assert root is not None
    rng = random.Random(7)
    tokens = [rng.randrange(1000) for _ in range(40)]  # 10 pages
    expected = chain_keys(root_key, tokens, PS)
    node = tree.add_child(root, token_bytes(tokens))
    tail = node
    head = tree.split(tail, 6)  # head: pages 0-5, tail: 6-9
    middle = tree.split(tail, 2)  # head 0-5, middle 6-7, tail 8-9
    assert tree.page_keys(middle) == expected[6:8]  # its ancestors' first
    assert head.keys == expected[:6] and tail.keys == []
    for node_ in (head, middle, tail):
        node_.residence.set_copy(Tier.DEVICE, list(range(node_.num_pages)))
    merged = tree.merge(middle)  # middle knows all its keys: the tail's (none) follow
    assert merged is tail and tail.keys == expected[6:8] and tail.num_pages == 4
    cut = tree.split(tail, 1)  # cut: page 6; tail: 7-9 knowing page 7's key only
    assert cut.keys == expected[6:7] and tail.keys == expected[7:8]
    assert tree.page_keys(tail) == expected[7:]
    fresh = tree.split(tail, 2)
    fresh.keys.clear()  # as if never computed: a merge keeps only the head's known keys
    tree.merge(fresh)
    assert tail.keys == [] and tail.num_pages == 3
    assert tree.page_keys(tail) == expected[7:]
    assert tree.parent_key(tail) == expected[6]


def test_integrity_checks_the_keys_a_node_knows() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    pages = cache.allocate(3)
    assert pages is not None
    node = cache.insert(list(range(12)), "ns", pages).node
    assert node is not None and cache.check_integrity().ok
    keys = cache.tree.page_keys(node)
    assert cache.check_integrity().ok
    keys[1] = bytes(16)
    problems = cache.check_integrity().problems
    assert any("page 1 key does not chain" in problem for problem in problems)

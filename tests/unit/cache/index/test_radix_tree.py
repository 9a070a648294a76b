import pytest

from tieredkv.cache.index.page_key import chain_keys, namespace_root_key, token_bytes
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier

PS = 4


def _tree_with(tokens: list[int]) -> tuple[RadixTree, bytes]:
    tree = RadixTree(PS, Residence.for_root)
    key = namespace_root_key(b"fp", "ns")
    root = tree.root(key, create=True)
    node = tree.add_child(root, token_bytes(tokens))
    node.residence.set_copy(Tier.DEVICE, list(range(len(tokens) // PS)))
    node.residence.set_copy(Tier.DISK, [10 + i for i in range(len(tokens) // PS)])
    return tree, key


def test_walk_reports_a_partial_node_and_split_cuts_every_copy() -> None:
    tokens = list(range(12))
    tree, key = _tree_with(tokens)
    root = tree.root(key, create=False)
    probe = [*tokens[:8], 99, 99, 99, 99]
    ((node, matched),) = tree.walk(root, token_bytes(probe), max_pages=3)
    assert matched == 2 and node.num_pages == 3
    head = tree.split(node, 2)
    assert head.parent is root and node.parent is head
    assert head.residence.copies == {Tier.DEVICE: [0, 1], Tier.DISK: [10, 11]}
    assert node.residence.copies == {Tier.DEVICE: [2], Tier.DISK: [12]}
    assert head.keys == node.keys == []  # no page has needed a key yet
    assert tree.page_keys(node) == chain_keys(key, tokens, PS)[2:]
    assert head.keys == chain_keys(key, tokens, PS)[:2]  # computed first: node chains from it
    assert tree.parent_key(node) == head.keys[-1] and tree.parent_key(head) == key
    assert [n for n, _ in tree.walk(root, token_bytes(tokens), 3)] == [head, node]
    assert head.packed + node.packed == token_bytes(tokens)
    assert tree.num_nodes == 2


def test_walk_stops_at_max_pages() -> None:
    tree, key = _tree_with(list(range(12)))
    root = tree.root(key, create=False)
    ((node, matched),) = tree.walk(root, token_bytes(range(12)), max_pages=1)
    assert matched == 1 and node.num_pages == 3


def test_merge_only_same_copies_without_locks() -> None:
    tokens = list(range(12))
    tree, key = _tree_with(tokens)
    root = tree.root(key, create=False)
    tail = root.children[token_bytes(range(4))]
    head = tree.split(tail, 1)
    tree.lock_path(tail, +1)
    assert not tree.can_merge(head)  # locked
    tree.lock_path(tail, -1)
    tail.residence.pop_copy(Tier.DISK)
    assert not tree.can_merge(head)  # different tiers
    tail.residence.set_copy(Tier.DISK, [11, 12])
    merged = tree.merge(head)
    assert merged is tail and not head.attached and tail.parent is root
    assert tail.residence.copies == {Tier.DEVICE: [0, 1, 2], Tier.DISK: [10, 11, 12]}
    assert tree.page_keys(tail) == chain_keys(key, tokens, PS) and tree.num_nodes == 1
    assert tail.packed == token_bytes(tokens)


def test_lock_counts_run_up_the_path() -> None:
    tree, key = _tree_with(list(range(12)))
    root = tree.root(key, create=False)
    tail = root.children[token_bytes(range(4))]
    head = tree.split(tail, 2)
    changed = tree.lock_path(tail, +1)
    assert changed == [tail, head] and head.lock_count == tail.lock_count == 1
    assert tree.lock_path(tail, +1) == []
    tree.lock_path(tail, -1)
    assert tree.lock_path(tail, -1) == [tail, head] and head.lock_count == 0
    with pytest.raises(AssertionError):
        tree.lock_path(tail, -1)


def test_namespaces_never_share_nodes_or_keys() -> None:
    tree = RadixTree(PS, Residence.for_root)
    tokens = list(range(8))
    a = tree.add_child(tree.root(namespace_root_key(b"fp", "a"), create=True), token_bytes(tokens))
    b = tree.add_child(tree.root(namespace_root_key(b"fp", "b"), create=True), token_bytes(tokens))
    assert a is not b and not set(tree.page_keys(a)) & set(tree.page_keys(b))


def test_remove_detaches_a_leaf() -> None:
    tree, key = _tree_with(list(range(8)))
    node = tree.root(key, create=False).children[token_bytes(range(4))]
    node.residence.pop_copy(Tier.DEVICE)
    node.residence.pop_copy(Tier.DISK)
    tree.remove(node)
    assert not node.attached and tree.num_nodes == 0
    assert tree.root(key, create=False) is None  # the namespace held nothing more: gone too

"""The per-node sliding-page rule the gap tests drop by (`tests/support/sliding_drop.py`) over
a real radix tree: a node's pages keep their sliding part exactly where some root-to-leaf path
through the node keeps it (`kept_sliding_pages` over that path's node ends), however the tree
branches."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.support.sliding_drop import node_kept_sliding
from tieredkv.cache.index.page_key import namespace_root_key, token_bytes
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.sliding_pages import kept_sliding_pages

PS = 4


def random_tree(rng: random.Random) -> tuple[RadixTree, list[RadixNode]]:
    tree = RadixTree(PS, Residence.for_root)
    root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
    nodes = [root]
    for first in range(rng.randint(1, 12)):
        parent = rng.choice(nodes)
        tokens = [1000 + first, *(rng.randrange(100) for _ in range(rng.randint(1, 6) * PS - 1))]
        nodes.append(tree.add_child(parent, token_bytes(tokens)))
    return tree, nodes[1:]


def by_paths(nodes: list[RadixNode], window: int) -> dict[RadixNode, np.ndarray]:
    """Each node's pages kept on some root-to-leaf path, by the path-level rule."""
    kept = {node: np.zeros(node.num_pages, dtype=bool) for node in nodes}
    for leaf in (node for node in nodes if not node.children):
        path = leaf.path()
        ends = np.cumsum([node.num_tokens for node in path])
        on_path = kept_sliding_pages(int(ends[-1]) // PS, ends.tolist(), window, PS)
        for node, end in zip(path, ends, strict=True):
            first = (int(end) - node.num_tokens) // PS
            kept[node] |= on_path[first : first + node.num_pages]
    return kept


@pytest.mark.parametrize("seed", range(30))
def test_a_node_keeps_what_some_path_through_it_keeps(seed: int) -> None:
    rng = random.Random(seed)
    _, nodes = random_tree(rng)
    window = rng.choice([1, 3, 4, 9, 16, 23, 64])
    expected = by_paths(nodes, window)
    for node in nodes:
        kept = node_kept_sliding(node.num_tokens, window, PS)
        assert kept.tolist() == expected[node].tolist(), node


def test_a_long_node_keeps_only_its_last_window_whatever_follows_it() -> None:
    tree = RadixTree(PS, Residence.for_root)
    root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
    node = tree.add_child(root, token_bytes(range(10 * PS)))
    last_window = [False] * 7 + [True] * 3  # window 13 from token 40: tokens 28..39
    assert node_kept_sliding(node.num_tokens, 13, PS).tolist() == last_window
    child = tree.add_child(node, token_bytes(range(500, 500 + PS)))  # tokens 32..43
    tree.add_child(child, token_bytes(range(600, 600 + PS)))  # tokens 36..47
    tree.add_child(node, token_bytes(range(700, 700 + 3 * PS)))  # tokens 40..51
    assert node_kept_sliding(node.num_tokens, 13, PS).tolist() == last_window
    assert node_kept_sliding(child.num_tokens, 13, PS).tolist() == [True]
    assert node_kept_sliding(node.num_tokens, 1, PS).tolist() == [False] * 10  # reads none

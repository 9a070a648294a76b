"""The whole-run walk against a page-by-page reference walk on random trees."""

import random
from collections.abc import Sequence

from tieredkv.cache.index.page_key import namespace_root_key, token_bytes
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.residency.residence import Residence

PS = 4


def _reference_walk(
    root: RadixNode, tokens: Sequence[int], max_pages: int
) -> list[tuple[RadixNode, int]]:
    """Page by page, the way the tree walked before it compared whole runs."""
    path: list[tuple[RadixNode, int]] = []
    node, pos = root, 0
    while pos < max_pages and (pos + 1) * PS <= len(tokens):
        child = node.children.get(token_bytes(tokens[pos * PS : (pos + 1) * PS]))
        if child is None:
            break
        count = 1
        limit = min(child.num_pages, max_pages - pos)
        while count < limit and child.page_ids(count, PS) == tuple(
            tokens[(pos + count) * PS : (pos + count + 1) * PS]
        ):
            count += 1
        path.append((child, count))
        if count < child.num_pages:
            break
        node, pos = child, pos + count
    return path


def _grow(tree: RadixTree, root: RadixNode, tokens: list[int]) -> None:
    """Index `tokens`' full pages: split where they diverge, attach the rest."""
    walked = tree.walk(root, token_bytes(tokens), len(tokens) // PS)
    parent, covered = root, 0
    for node, count in walked:
        parent = node if count == node.num_pages else tree.split(node, count)
        covered += count
    if covered < len(tokens) // PS:
        tree.add_child(parent, token_bytes(tokens[covered * PS : len(tokens) // PS * PS]))


def _variant(rng: random.Random, base: list[int]) -> list[int]:
    """A prefix of `base`, maybe changed at one token (often inside a page), then a tail."""
    out = base[: rng.randint(0, len(base))]
    if out and rng.random() < 0.6:
        out[rng.randrange(len(out))] = rng.randint(0, 2)
    return out + [rng.randint(0, 2) for _ in range(rng.randint(0, 9))]


def test_walk_equals_the_page_by_page_walk_on_random_trees() -> None:
    rng = random.Random(7)
    checked_partial = checked_from_node = 0
    for _ in range(40):
        tree = RadixTree(PS, Residence.for_root)
        root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
        assert root is not None
        bases = [[rng.randint(0, 2) for _ in range(rng.randint(4, 40))] for _ in range(3)]
        for _ in range(12):
            _grow(tree, root, _variant(rng, rng.choice(bases)))
        for _ in range(40):
            query = _variant(rng, rng.choice(bases))
            max_pages = rng.randint(0, len(query) // PS + 1)
            expected = _reference_walk(root, query, max_pages)
            packed = token_bytes(query)
            assert tree.walk(root, packed, max_pages) == expected
            checked_partial += bool(expected) and expected[-1][1] < expected[-1][0].num_pages
            # from any node the path passes whole: the rest of the same path
            depth = 0
            for index, (node, count) in enumerate(expected):
                if count < node.num_pages:
                    break
                depth += count
                rest = tree.walk(node, packed, max_pages, first_page=depth)
                assert rest == expected[index + 1 :]
                checked_from_node += 1
    assert checked_partial > 50  # divergence inside a node was exercised, not only at ends
    assert checked_from_node > 50


def test_walk_finds_the_first_differing_page_of_a_long_node() -> None:
    tree = RadixTree(PS, Residence.for_root)
    root = tree.root(namespace_root_key(b"fp", "ns"), create=True)
    assert root is not None
    tokens = list(range(4 * 37))
    node = tree.add_child(root, token_bytes(tokens))
    for page in range(1, 37):
        for offset in (0, 3):  # first or last token of the page differs
            probe = list(tokens)
            probe[page * PS + offset] = -1
            assert tree.walk(root, token_bytes(probe), 37) == [(node, page)]
            # the query ends inside the node, past the difference: still the first page
            assert tree.walk(root, token_bytes(probe[: (page + 1) * PS]), 37) == [(node, page)]
    assert tree.walk(root, token_bytes(tokens), 37) == [(node, 37)]
    assert tree.walk(root, token_bytes(tokens[:-1]), 37) == [(node, 36)]  # a partial last page
    assert tree.walk(root, token_bytes(tokens), 20) == [(node, 20)]  # max_pages inside it

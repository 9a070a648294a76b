"""`TieredCache.match` and `TieredCache.insert`: walking the tree for a prompt.

Both split a node where the prompt diverges inside it, so a match ends exactly at a node
boundary (its `last_node` can be locked) and an insert can branch there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tieredkv.cache.cache_results import InsertResult, MatchResult, MatchSegment
from tieredkv.cache.page_key import namespace_root_key
from tieredkv.cache.radix_tree import RadixNode
from tieredkv.cache.residency import parent_committed
from tieredkv.cache.tier import Tier
from tieredkv.cache.token_run import TOKEN_BYTES, TokenSequence, packed_bytes

if TYPE_CHECKING:
    from tieredkv.cache.tiered_cache import TieredCache

_TIERS = tuple(Tier)  # iterating the enum itself is slow
_NO_SEGMENT = {tier: MatchSegment(tier) for tier in _TIERS}  # immutable: shared by results


def _walk_exact(
    cache: TieredCache, root: RadixNode, query: bytes, max_pages: int, first_page: int = 0
) -> list[RadixNode]:
    walked = cache.tree.walk(root, query, max_pages, first_page)
    nodes = [node for node, _ in walked]
    if walked and walked[-1][1] < walked[-1][0].num_pages:
        node, count = walked[-1]
        nodes[-1] = cache.tree.split(node, count)
        cache.residency.refresh(nodes[-1])
    return nodes


def _touch(cache: TieredCache, nodes: list[RadixNode]) -> None:
    """Mark `nodes` used now, in path order (one clock tick each, so ties keep the order the
    path gives). No heap push: `TierHeap.pop` re-prioritises lazily."""
    for clock, node in enumerate(nodes, cache.access_clock + 1):
        node.last_access = clock
    cache.access_clock += len(nodes)


def match_prefix(cache: TieredCache, tokens: TokenSequence, namespace: str) -> MatchResult:
    query = packed_bytes(tokens)
    num_tokens = len(query) // TOKEN_BYTES
    key = namespace_root_key(cache.fingerprint, namespace)
    max_pages = max(num_tokens - 1, 0) // cache.page_size
    root = cache.tree.root(key, create=False)
    if not (cache.config.enable_prefix_reuse and root is not None and max_pages > 0):
        return MatchResult(key, num_tokens, cache.page_size, *_NO_SEGMENT.values(), None)
    # group the path by serving tier (its fastest copy): device nodes, then host, then disk
    nodes: tuple[list[RadixNode], ...] = ([], [], [])
    pages: tuple[list[int], ...] = ([], [], [])
    matched: list[RadixNode] = []
    previous = Tier.DEVICE
    for node in _walk_exact(cache, root, query, max_pages):
        copies = node.copies
        if not copies:
            break  # emptied by a failed read, kept only by a lock: a miss from here
        tier = min(copies)
        assert tier >= previous, f"match tiers out of order at {node}"
        previous = tier
        nodes[tier].append(node)
        pages[tier].extend(copies[tier])
        matched.append(node)
    _touch(cache, matched)
    segments = [
        MatchSegment(t, tuple(nodes[t]), tuple(pages[t])) if nodes[t] else _NO_SEGMENT[t]
        for t in _TIERS
    ]
    return MatchResult(
        key, num_tokens, cache.page_size, *segments, matched[-1] if matched else None
    )


def _start_path(
    root: RadixNode, start_node: RadixNode | None, start_pages: int, num_pages: int
) -> list[RadixNode]:
    """The path to `start_node`, checked cheaply against the caller's claim that it holds
    exactly the first `start_pages` pages (its tokens are taken on trust)."""
    if start_node is None:
        assert start_pages == 0, f"start_pages={start_pages} without a start_node"
        return []
    assert start_node.attached and start_node.root_key == root.root_key, f"start at {start_node}"
    path = start_node.path()
    depth = sum(node.num_pages for node in path)
    assert depth == start_pages <= num_pages, (
        f"{start_node} ends at page {depth}, not {start_pages}"
    )
    assert path[0].parent is root
    return path


def insert_pages(
    cache: TieredCache,
    tokens: TokenSequence,
    namespace: str,
    device_pages: Sequence[int],
    start_node: RadixNode | None = None,
    start_pages: int = 0,
) -> InsertResult:
    query = packed_bytes(tokens)
    page_bytes = cache.tree.page_bytes
    num_pages = min(len(query) // page_bytes, len(device_pages))
    if not cache.config.enable_prefix_reuse or num_pages == 0:
        return InsertResult(0, 0, None, (), ())
    root = cache.tree.root(namespace_root_key(cache.fingerprint, namespace), create=True)
    assert root is not None
    existing = _start_path(root, start_node, start_pages, num_pages)
    existing += _walk_exact(cache, start_node or root, query, num_pages, start_pages)
    tree_pages: list[int] = []
    duplicates: list[int] = []
    covered = 0
    touched: list[RadixNode] = []
    copied: list[RadixNode] = []  # nodes given a device copy here: new heap entries
    for node in existing:
        mine = list(device_pages[covered : covered + node.num_pages])
        if Tier.DEVICE in node.copies:
            theirs = node.copies[Tier.DEVICE]
            if mine != theirs:  # usually equal: the request's table starts with the tree's
                duplicates.extend(a for a, b in zip(mine, theirs, strict=True) if a != b)
        elif Tier.DEVICE not in node.inflight and parent_committed(node, Tier.DEVICE):
            _take(cache, mine)  # the tree had these pages on host or disk only: adopt ours
            node.set_copy(Tier.DEVICE, mine)
            copied.append(node)
            cache.residency.refresh(node.parent)
            cache.residency.commit_waiting_children(node)
        else:
            break  # its device copy is still in flight: the caller keeps its pages from here
        tree_pages.extend(node.copies[Tier.DEVICE])
        covered += node.num_pages
        touched.append(node)
    num_existing = sum(node.num_pages for node in existing)
    deepest = touched[-1] if touched else None
    if covered == num_existing and covered < num_pages:
        parent = deepest or root
        new_pages = list(device_pages[covered:num_pages])
        _take(cache, new_pages)
        deepest = cache.tree.add_child(parent, query[covered * page_bytes : num_pages * page_bytes])
        deepest.set_copy(Tier.DEVICE, new_pages)
        tree_pages.extend(new_pages)
        covered = num_pages
        touched.append(deepest)
        copied.append(deepest)
        cache.residency.refresh(parent)
    _touch(cache, touched)
    for node in copied:
        cache.residency.refresh(node)
    return InsertResult(num_existing, covered, deepest, tuple(tree_pages), tuple(duplicates))


def _take(cache: TieredCache, pages: list[int]) -> None:
    """Move a request's private device pages into the tree."""
    for page in pages:
        assert page in cache.private_pages, f"device page {page} is not a request's to give"
        cache.private_pages.remove(page)

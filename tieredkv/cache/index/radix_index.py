"""`RadixIndex`: matching and inserting prompts, locks on paths, and the pages requests hold.

Both `match` and `insert` split a node where the prompt diverges inside it, so a match ends
exactly at a node boundary (its `last_node` can be locked) and an insert can branch there. The
index owns the access clock (every match and insert marks its path used, one tick per node) and
the bookkeeping of device pages lent to requests (`private_pages`). It never reads or writes
copies: it hands pages to the layer that keeps them (`TreeEvents`) and tells it whenever it
changed a node; a match asks each node's record for its serving copy (`NodeState.serve_into`).

With sliding-window layers (`sliding_window`, the longest window), a match ends where a request
may continue from: before the last page whose window reads a page its serving copy holds
without the sliding part (`sliding_pages.reusable_tokens`), and an insert stops before a node
whose device copy lacks a sliding part the request has (the request keeps its own pages).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from tieredkv.cache.index.match_results import InsertResult, MatchResult, MatchSegment
from tieredkv.cache.index.page_key import namespace_root_key
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.index.token_run import TOKEN_BYTES, TokenSequence, packed_bytes
from tieredkv.cache.sliding_pages import reusable_tokens
from tieredkv.cache.tier import Tier

_TIERS = tuple(Tier)  # iterating the enum itself is slow
_NO_SEGMENT = {tier: MatchSegment(tier) for tier in _TIERS}  # immutable: shared by results


class TreeEvents(Protocol):
    """What the index reports to the layer that keeps copies (`Residency`)."""

    def refresh(self, node: RadixNode | None) -> None:
        """`node`'s shape, lock count or copies changed: it may have become evictable."""

    def adopt_device_copy(self, node: RadixNode, pages: list[int]) -> bool:
        """`insert` offers `node`, which has no device copy, a request's `pages` as one. False
        when it cannot commit one now (a device copy in flight, or its parent has none)."""

    def fill_device_gaps(self, node: RadixNode, pages: list[int]) -> bool:
        """Give `node`'s device copy its missing sliding parts from a request's `pages`."""

    def new_device_copy(self, node: RadixNode, pages: list[int]) -> None:
        """`insert` made `node` for a request's `pages`: its device copy."""

    def found_copy(
        self, node: RadixNode, tier: Tier, pages: list[int], gaps: frozenset[int]
    ) -> None:
        """`attach_found` made `node` for `pages` a store of `tier` holds: its only copy
        (`gaps`: the pages it holds without their sliding part)."""

    def released(self, node: RadixNode) -> None:
        """`node`'s last lock went: it may now be empty and leave the tree."""


class RadixIndex:
    """The tree behind `TieredCache.match` / `insert` / `lock` / `unlock` (engine thread)."""

    def __init__(
        self,
        tree: RadixTree,
        fingerprint: bytes,
        prefix_reuse: bool,
        events: TreeEvents,
        sliding_window: int | None = None,
    ) -> None:
        self.tree = tree
        self.sliding_window = sliding_window
        self.page_size = tree.page_size
        self.fingerprint = fingerprint
        self.prefix_reuse = prefix_reuse
        self.events = events
        # what follows an insert that left a path (the write policy's copies: `Demoter`)
        self.after_insert: Callable[[RadixNode], None] = _nothing
        # what follows the last lock on a node going (the writes a running sequence held back)
        self.after_unlock: Callable[[RadixNode], None] = _nothing
        self.access_clock = 0
        self.private_pages: set[int] = set()  # device pages lent to requests
        self.lock_holders: Counter[RadixNode] = Counter()
        # each namespace's flush generation (`FlushGenerations.of`), mixed into its root key
        self.generation_of: Callable[[str], tuple[int, int]] = _first_generation

    # --- matching and inserting ------------------------------------------------------------

    def root_key(self, namespace: str) -> bytes:
        """The root key of `namespace`'s chain in its current flush generation."""
        return namespace_root_key(self.fingerprint, namespace, self.generation_of(namespace))

    def match(self, tokens: TokenSequence, namespace: str) -> MatchResult:
        query = packed_bytes(tokens)
        num_tokens = len(query) // TOKEN_BYTES
        key = self.root_key(namespace)
        max_pages = max(num_tokens - 1, 0) // self.page_size
        root = self.tree.root(key, create=False, name=namespace)
        if not (self.prefix_reuse and root is not None and max_pages > 0):
            return MatchResult(key, num_tokens, self.page_size, *_NO_SEGMENT.values(), None)
        nodes, pages, matched = self._serving_path(self._walk_exact(root, query, max_pages))
        reusable = self._reusable_pages(matched)
        if reusable < sum(len(tier_pages) for tier_pages in pages):
            walked = self._walk_exact(root, query, reusable) if reusable else []
            nodes, pages, matched = self._serving_path(walked)
        self._touch(matched)
        segments = [
            MatchSegment(t, tuple(nodes[t]), tuple(pages[t])) if nodes[t] else _NO_SEGMENT[t]
            for t in _TIERS
        ]
        last = matched[-1] if matched else None
        return MatchResult(key, num_tokens, self.page_size, *segments, last)

    def _serving_path(
        self, walked: list[RadixNode]
    ) -> tuple[tuple[list[RadixNode], ...], tuple[list[int], ...], list[RadixNode]]:
        """The walked path grouped by serving tier (its fastest copy): device nodes, then host,
        then disk; its nodes and pages per tier and the nodes served."""
        nodes: tuple[list[RadixNode], ...] = tuple([] for _ in _TIERS)
        pages: tuple[list[int], ...] = tuple([] for _ in _TIERS)
        matched: list[RadixNode] = []
        previous = Tier.DEVICE
        for node in walked:
            tier = node.residence.serve_into(pages)
            if tier is None:
                break  # emptied by a failed read, kept only by a lock: a miss from here
            assert tier >= previous, f"match tiers out of order at {node}"
            previous = tier
            nodes[tier].append(node)
            matched.append(node)
        return nodes, pages, matched

    def _reusable_pages(self, matched: list[RadixNode]) -> int:
        """The pages of the served path a request may continue after (all of them unless a
        sliding part its window reads is missing: `reusable_tokens`)."""
        num_pages = sum(node.num_pages for node in matched)
        window = self.sliding_window
        if window is None or not any(node.residence.serving_gaps() for node in matched):
            return num_pages
        kept: list[bool] = []
        for node in matched:
            gaps = node.residence.serving_gaps()
            kept.extend(index not in gaps for index in range(node.num_pages))
        matched_tokens = num_pages * self.page_size
        return reusable_tokens(matched_tokens, kept, window, self.page_size) // self.page_size

    def insert(
        self,
        tokens: TokenSequence,
        namespace: str,
        device_pages: Sequence[int],
        *,
        start_node: RadixNode | None = None,
        start_pages: int = 0,
    ) -> InsertResult:
        """Index the full pages of `tokens` (ids or `PackedTokens`) whose KV is in
        `device_pages` (the request's page table). Pages the tree has already are reported
        (`InsertResult`), the others become the tree's; lock `result.node` next. A caller whose
        table starts with tree pages passes the node it holds locked (`start_node`,
        `start_pages` pages deep): the walk starts past those pages, under their root even after
        a flush advanced the namespace's generation (from the root it would not find them). The
        path it leaves goes to `after_insert` (write policy)."""
        query = packed_bytes(tokens)
        page_bytes = self.tree.page_bytes
        num_pages = min(len(query) // page_bytes, len(device_pages))
        if not self.prefix_reuse or num_pages == 0:
            return InsertResult(0, 0, None, (), ())
        # a request whose pages are in the tree goes on under their root, even when a flush
        # has advanced its namespace's generation since (they are matched no more either way)
        root_key = self.root_key(namespace) if start_node is None else start_node.root_key
        root = self.tree.root(root_key, create=True, name=namespace)
        assert root is not None
        existing = _start_path(root, start_node, start_pages, num_pages)
        existing += self._walk_exact(start_node or root, query, num_pages, start_pages)
        tree_pages: list[int] = []
        duplicates: list[int] = []
        covered = 0
        touched: list[RadixNode] = []
        copied: list[RadixNode] = []  # nodes given a device copy here: new heap entries
        for node in existing:
            mine = list(device_pages[covered : covered + node.num_pages])
            theirs = node.residence.device_pages()
            if theirs is None:
                if not self.events.adopt_device_copy(node, mine):
                    break  # its device copy is in flight: the caller keeps its pages from here
                self.reclaim(mine)  # the tree had these pages on host or disk only: ours now
                copied.append(node)
                theirs = mine
            elif mine != theirs:  # usually equal: the request's table starts with the tree's
                if node.residence.device_gaps() and not self.events.fill_device_gaps(node, mine):
                    break  # the tree's copy lacks parts ours hold and has no room: keep ours
                duplicates.extend(a for a, b in zip(mine, theirs, strict=True) if a != b)
            tree_pages.extend(theirs)
            covered += node.num_pages
            touched.append(node)
        num_existing = sum(node.num_pages for node in existing)
        deepest = touched[-1] if touched else None
        if covered == num_existing and covered < num_pages:
            parent = deepest or root
            new_pages = list(device_pages[covered:num_pages])
            self.reclaim(new_pages)
            deepest = self.tree.add_child(
                parent, query[covered * page_bytes : num_pages * page_bytes]
            )
            self.events.new_device_copy(deepest, new_pages)
            tree_pages.extend(new_pages)
            covered = num_pages
            touched.append(deepest)
            copied.append(deepest)
            self.events.refresh(parent)
        self._touch(touched)
        for node in copied:
            self.events.refresh(node)
        if deepest is not None:
            self.after_insert(deepest)
        return InsertResult(num_existing, covered, deepest, tuple(tree_pages), tuple(duplicates))

    def attach_found(
        self,
        query: bytes,
        namespace: str,
        match: MatchResult,
        keys: Sequence[bytes],
        tier: Tier,
        pages: Sequence[int],
        gaps: frozenset[int] = frozenset(),
    ) -> RadixNode | None:
        """Attach the `len(keys)` pages of packed `query` after `match`'s last page as a new
        node whose only copy is `pages` of `tier` (pages a store was found to hold by key;
        `gaps`: those it holds without their sliding part).
        None, nothing attached, where the tree already has a node there (an emptied one that
        a lock keeps) or the match's path left the tree since."""
        root = self.tree.root(match.namespace_key, create=True, name=namespace)
        assert root is not None
        parent = match.last_node or root
        if not parent.attached or not keys:
            return None
        page_bytes = self.tree.page_bytes
        start = match.num_pages * page_bytes
        run = query[start : start + len(keys) * page_bytes]
        if run[:page_bytes] in parent.children:
            return None
        node = self.tree.attach(parent, run, list(keys))
        self.events.found_copy(node, tier, list(pages), gaps)
        self._touch([node])
        self.events.refresh(node)
        self.events.refresh(parent)
        return node

    def _walk_exact(
        self, root: RadixNode, query: bytes, max_pages: int, first_page: int = 0
    ) -> list[RadixNode]:
        walked = self.tree.walk(root, query, max_pages, first_page)
        nodes = [node for node, _ in walked]
        if walked and walked[-1][1] < walked[-1][0].num_pages:
            node, count = walked[-1]
            nodes[-1] = self.tree.split(node, count)
            self.events.refresh(nodes[-1])
        return nodes

    def _touch(self, nodes: list[RadixNode]) -> None:
        """Mark `nodes` used now, in path order (one clock tick each, so ties keep the order
        the path gives). No heap push: `TierHeap.pop` re-prioritises lazily."""
        for clock, node in enumerate(nodes, self.access_clock + 1):
            node.last_access = clock
        self.access_clock += len(nodes)

    # --- device pages lent to requests -----------------------------------------------------

    def lend(self, pages: Sequence[int]) -> None:
        """`pages` (just allocated) now belong to a request."""
        self.private_pages.update(pages)

    def reclaim(self, pages: Sequence[int]) -> None:
        """`pages` stop being a request's: returned (the caller frees them) or taken by the
        tree. Never pages the tree owns."""
        private = self.private_pages
        if not private.issuperset(pages):  # set operations: C loops, not a step per page
            stray = next(page for page in pages if page not in private)
            raise AssertionError(f"device page {stray} is not a request's")
        before = len(private)
        private.difference_update(pages)
        if before - len(private) != len(pages):
            private.update(pages)  # as it was: every page was lent
            raise AssertionError(f"device pages {list(pages)} name a page twice")

    # --- pinned prefixes -------------------------------------------------------------------

    def full_path(self, tokens: TokenSequence, namespace: str) -> RadixNode | None:
        """The node ending `tokens`' last full page when the tree holds all of their full
        pages (a node is split there if it runs on), else None. Touches nothing."""
        query = packed_bytes(tokens)
        num_pages = len(query) // self.tree.page_bytes
        key = self.root_key(namespace)
        root = self.tree.root(key, create=False, name=namespace)
        if root is None or num_pages == 0 or not self.prefix_reuse:
            return None
        walked = self.tree.walk(root, query, num_pages, 0)
        if sum(count for _, count in walked) < num_pages:
            return None
        return self._walk_exact(root, query, num_pages)[-1]

    # --- locks -----------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Pin `node` and its ancestors: never evicted, demoted or merged until unlocked."""
        assert node is not None and node.attached, f"lock of {node}"
        self.lock_holders[node] += 1
        self.tree.lock_path(node, +1)  # heap entries of locked nodes are skipped when popped

    def unlock(self, node: RadixNode) -> None:
        """Release one `lock(node)`."""
        assert self.lock_holders[node] > 0, f"unlock of {node} without a lock"
        self.lock_holders[node] -= 1
        if not self.lock_holders[node]:
            del self.lock_holders[node]
        for changed in self.tree.lock_path(node, -1):
            self.events.released(changed)
        if not node.lock_count and node.attached:
            self.after_unlock(node)


def _nothing(node: RadixNode) -> None:
    pass


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


def _first_generation(namespace: str) -> tuple[int, int]:
    return (0, 0)

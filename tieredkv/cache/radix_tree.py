"""The radix tree: a pure index of page-aligned token runs, one root per namespace.

The tree keeps the shape consistent (split, merge, attach, detach, lock counts on the path);
which copies exist and move is decided by `TieredCache`. Not thread-safe: the engine thread owns
it. Children are keyed by the tokens of their first page, so matching never hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tieredkv.cache.page_key import chain_keys
from tieredkv.cache.radix_node import NO_COPY, PageTokens, RadixNode

__all__ = ["RadixNode", "RadixTree"]


class RadixTree:
    """Namespace roots and their subtrees. `page_size` tokens per page."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.roots: dict[bytes, RadixNode] = {}
        self.num_nodes = 0  # excluding namespace roots

    def root(self, root_key: bytes, create: bool) -> RadixNode | None:
        node = self.roots.get(root_key)
        if node is None and create:
            node = RadixNode(None, (), [], root_key)
            self.roots[root_key] = node
        return node

    def walk(
        self, root: RadixNode, tokens: Sequence[int], max_pages: int, first_page: int = 0
    ) -> list[tuple[RadixNode, int]]:
        """The matched path as (node, pages matched in it); only the last may be partial.

        Walks pages `first_page` to `max_pages` of `tokens` down from `root` (a namespace root,
        or the node the first `first_page` pages end at). Each node's run is compared with the
        query in one comparison; only a node where they diverge is searched (by halving) for
        its first differing page."""
        ps = self.page_size
        start, end = first_page * ps, min(max_pages, len(tokens) // ps) * ps
        # one conversion (slices of a tuple compare with the nodes' tuples): from the root the
        # whole list (tuple(list) copies once, tuple(list[:end]) twice), else the part walked
        query = tuple(tokens) if start == 0 else tuple(tokens[start:end])
        pos, end = 0, end - start  # positions in `query`
        path: list[tuple[RadixNode, int]] = []
        node = root
        while pos < end:
            child = node.children.get(query[pos : pos + ps])
            if child is None:
                break
            run = child.tokens
            length = min(len(run), end - pos)
            if query[pos : pos + length] == (run if length == len(run) else run[:length]):
                count = length // ps
            else:  # pages [0, low) are equal; the first differing page is in [low, high)
                low, high = 1, length // ps
                while high - low > 1:
                    mid = (low + high) // 2
                    if query[pos + low * ps : pos + mid * ps] == run[low * ps : mid * ps]:
                        low = mid
                    else:
                        high = mid
                count = low
            path.append((child, count))
            if count < child.num_pages:
                break
            node, pos = child, pos + count * ps
        return path

    def add_child(self, parent: RadixNode, tokens: Sequence[int]) -> RadixNode:
        """Attach a new node holding `tokens` (whole pages) under `parent`; keys are chained."""
        assert tokens and len(tokens) % self.page_size == 0, f"{len(tokens)} tokens"
        parent_key = parent.keys[-1] if parent.keys else parent.root_key
        node = RadixNode(
            parent, tuple(tokens), chain_keys(parent_key, tokens, self.page_size), parent.root_key
        )
        first = node.page_tokens(0, self.page_size)
        assert first not in parent.children, "a child with this first page already exists"
        parent.children[first] = node
        parent.child_ranks[NO_COPY] += 1
        self.num_nodes += 1
        return node

    def attach(self, parent: RadixNode, tokens: PageTokens, keys: list[bytes]) -> RadixNode:
        """Attach a node whose keys are already known (warm restart)."""
        node = RadixNode(parent, tokens, keys, parent.root_key)
        parent.children[node.page_tokens(0, self.page_size)] = node
        parent.child_ranks[NO_COPY] += 1
        self.num_nodes += 1
        return node

    def split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages; return the new head (the node keeps the tail).

        The tail keeps its identity so lock holders and children stay valid; copies and
        transfers in flight are cut at the same page.
        """
        assert 0 < num_pages < node.num_pages, f"split {num_pages} of {node.num_pages}"
        assert node.parent is not None
        ps = self.page_size
        head = RadixNode(
            node.parent, node.tokens[: num_pages * ps], node.keys[:num_pages], node.root_key
        )
        head.copies = {tier: pages[:num_pages] for tier, pages in node.copies.items()}
        node.copies = {tier: pages[num_pages:] for tier, pages in node.copies.items()}
        head.inflight = {t: part.split_head(num_pages, head) for t, part in node.inflight.items()}
        head.lock_count = node.lock_count
        head.last_access = node.last_access
        node.parent.children[head.page_tokens(0, ps)] = head
        node.tokens = node.tokens[num_pages * ps :]
        node.keys = node.keys[num_pages:]
        node.parent = head
        head.children[node.page_tokens(0, ps)] = node
        rank, on_disk = node.rank()  # the parent's counts stand: head has the node's rank
        head.child_ranks[rank] = 1
        head.children_on_disk = int(on_disk)
        self.num_nodes += 1
        return head

    def can_merge(self, node: RadixNode) -> bool:
        """One child, the same copy tiers, no locks and nothing in flight on either."""
        if node.parent is None or len(node.children) != 1:
            return False
        child = next(iter(node.children.values()))
        return node.copies.keys() == child.copies.keys() and not (
            node.lock_count or child.lock_count or node.inflight or child.inflight
        )

    def merge(self, node: RadixNode) -> RadixNode:
        """Fold `node` into its only child (which survives, longer); `node` is detached."""
        assert self.can_merge(node) and node.parent is not None
        child = next(iter(node.children.values()))
        child.tokens = node.tokens + child.tokens
        child.keys = node.keys + child.keys
        child.copies = {tier: node.copies[tier] + pages for tier, pages in child.copies.items()}
        child.last_access = max(child.last_access, node.last_access)
        child.parent = node.parent
        node.parent.children[child.page_tokens(0, self.page_size)] = child
        node.children = {}
        node.attached = False
        self.num_nodes -= 1
        return child

    def remove(self, node: RadixNode) -> None:
        """Detach a childless node (its copies must already be freed)."""
        assert not node.children and node.parent is not None, "remove a leaf only"
        assert not node.copies and not node.inflight, f"remove {node} with copies"
        del node.parent.children[node.page_tokens(0, self.page_size)]
        node.parent.child_ranks[NO_COPY] -= 1
        node.attached = False
        self.num_nodes -= 1

    def lock_path(self, node: RadixNode, delta: int) -> list[RadixNode]:
        """Add `delta` (+1/-1) to the lock count of `node` and its ancestors.

        Returns the nodes whose count crossed zero (their evictability changed)."""
        changed = []
        current: RadixNode | None = node
        while current is not None and current.parent is not None:
            current.lock_count += delta
            assert current.lock_count >= 0, f"lock count below zero on {current}"
            if current.lock_count == (1 if delta > 0 else 0):
                changed.append(current)
            current = current.parent
        return changed

    def iter_nodes(self) -> Iterator[RadixNode]:
        """Every node below the namespace roots, parents before children (integrity checks)."""
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            if node.parent is not None:
                yield node
            stack.extend(node.children.values())

"""The radix tree: a pure index of page-aligned token runs, one root per namespace.

A node holds a run of whole pages (tokens, one chained key per page) and, per tier, the page ids
of its copy there (`copies`) and the transfers in flight towards a tier (`inflight`). The tree
only keeps the shape consistent (split, merge, attach, detach, lock counts on the path); which
copies exist and move is decided by `TieredCache`. Not thread-safe: the engine thread owns it.

Children are keyed by the tokens of their first page, so matching never hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from tieredkv.cache.page_key import chain_keys
from tieredkv.cache.tier import Tier

if TYPE_CHECKING:
    from tieredkv.cache.mover import TransferPart

PageTokens = tuple[int, ...]


class RadixNode:
    """A run of whole pages. The namespace root holds no pages and is never evicted."""

    __slots__ = (
        "attached",
        "children",
        "copies",
        "inflight",
        "keys",
        "last_access",
        "lock_count",
        "parent",
        "root_key",
        "stamps",
        "tokens",
    )

    def __init__(
        self, parent: RadixNode | None, tokens: PageTokens, keys: list[bytes], root_key: bytes
    ) -> None:
        self.parent = parent
        self.tokens = tokens
        self.keys = keys  # one chained page key per page
        self.root_key = root_key  # the namespace root's key
        self.children: dict[PageTokens, RadixNode] = {}
        self.copies: dict[Tier, list[int]] = {}  # committed copies: page ids per tier
        self.inflight: dict[Tier, TransferPart] = {}  # copies on their way, by destination tier
        self.lock_count = 0
        self.last_access = 0
        self.stamps = [0, 0, 0]  # per-tier heap entry versions (lazy deletion)
        self.attached = True

    def __repr__(self) -> str:
        tiers = ",".join(t.label for t in sorted(self.copies))
        return f"RadixNode(pages={self.num_pages}, copies=[{tiers}], locks={self.lock_count})"

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def parent_key(self) -> bytes:
        """The key chained into this node's first page (the parent's last page or the root)."""
        assert self.parent is not None, "a namespace root has no parent key"
        return self.parent.keys[-1] if self.parent.keys else self.parent.root_key

    def page_tokens(self, index: int, page_size: int) -> PageTokens:
        return self.tokens[index * page_size : (index + 1) * page_size]

    def fastest_copy(self) -> Tier | None:
        """The tier that serves this node now (its fastest committed copy), None if none."""
        return min(self.copies) if self.copies else None

    def in_closure(self, tier: Tier) -> bool:
        """True if a copy in `tier` or a faster tier exists or is in flight towards one."""
        if self.parent is None:
            return True
        return any(t <= tier for t in self.copies) or any(t <= tier for t in self.inflight)

    def has_disk_copy(self) -> bool:
        """A disk copy exists or is being written (the disk closure counts both)."""
        return self.parent is None or Tier.DISK in self.copies or Tier.DISK in self.inflight

    def path(self) -> list[RadixNode]:
        """The nodes from the namespace root's child down to this node."""
        nodes = []
        node: RadixNode | None = self
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes


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
        self, root: RadixNode, tokens: Sequence[int], max_pages: int
    ) -> list[tuple[RadixNode, int]]:
        """The matched path as (node, pages matched in it); only the last may be partial."""
        ps = self.page_size
        path: list[tuple[RadixNode, int]] = []
        node, pos = root, 0
        while pos < max_pages:
            child = node.children.get(tuple(tokens[pos * ps : (pos + 1) * ps]))
            if child is None:
                break
            count = 1
            limit = min(child.num_pages, max_pages - pos)
            while count < limit and child.page_tokens(count, ps) == tuple(
                tokens[(pos + count) * ps : (pos + count + 1) * ps]
            ):
                count += 1
            path.append((child, count))
            if count < child.num_pages:
                break
            node, pos = child, pos + count
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
        self.num_nodes += 1
        return node

    def attach(self, parent: RadixNode, tokens: PageTokens, keys: list[bytes]) -> RadixNode:
        """Attach a node whose keys are already known (warm restart)."""
        node = RadixNode(parent, tokens, keys, parent.root_key)
        parent.children[node.page_tokens(0, self.page_size)] = node
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

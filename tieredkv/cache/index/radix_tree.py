"""The radix tree: a pure index of page-aligned token runs, one root per namespace.

The tree keeps the shape consistent (split, merge, attach, detach, lock counts on the path);
which copies exist and move is decided by the residency layer, whose per-node records the tree
makes and reshapes through `NodeState` only (their factory for a namespace root is given to
it). Not thread-safe: the engine thread owns it. Nodes hold their tokens packed (int32
little-endian bytes, `token_run`): a node's run compares with a query in one memcmp. Children
are keyed by their first page's packed tokens, so matching never computes a page key, and
inserting does not either: a node's keys are computed when a page first needs one
(`page_keys`: a disk record, a restart index). A key depends only on the tokens from the
namespace root to its page, so keys once computed stay true through splits and merges, which
carry them along.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tieredkv.cache.index.page_key import chain_packed_keys
from tieredkv.cache.index.radix_node import NodeState, RadixNode
from tieredkv.cache.index.token_run import TOKEN_BYTES


class RadixTree:
    """Namespace roots and their subtrees. `page_size` tokens per page; `root_state` makes a
    namespace root's residency record (each child's comes from its parent's)."""

    def __init__(self, page_size: int, root_state: Callable[[RadixNode], NodeState]) -> None:
        self.page_size = page_size
        self.root_state = root_state
        self.page_bytes = page_size * TOKEN_BYTES  # a page's packed tokens
        self.roots: dict[bytes, RadixNode] = {}
        self.names: dict[bytes, str] = {}  # namespace names of roots, as matched or inserted
        self.num_nodes = 0  # excluding namespace roots

    def root(self, root_key: bytes, create: bool, name: str | None = None) -> RadixNode | None:
        """The namespace root with `root_key` (made if `create`); `name` records its namespace
        (a root rebuilt from disk has none until a request names it). A root left without
        children is dropped (`remove`), so namespaces that hold nothing cost nothing."""
        node = self.roots.get(root_key)
        if node is None and create:
            node = RadixNode(None, b"", 0, [], root_key, self.root_state)
            self.roots[root_key] = node
        if node is not None and name is not None:
            self.names[root_key] = name
        return node

    def walk(
        self, root: RadixNode, query: bytes, max_pages: int, first_page: int = 0
    ) -> list[tuple[RadixNode, int]]:
        """The matched path as (node, pages matched in it); only the last may be partial.

        Walks pages `first_page` to `max_pages` of `query` (packed tokens, `token_run`) down
        from `root` (a namespace root, or the node the first `first_page` pages end at). Each
        node's run is compared with the query in one memcmp; only a node where they diverge
        is searched (by halving) for its first differing page. Positions count bytes."""
        step = self.page_bytes
        pos, end = first_page * step, min(max_pages, len(query) // step) * step
        path: list[tuple[RadixNode, int]] = []
        node = root
        while pos < end:
            child = node.children.get(query[pos : pos + step])
            if child is None:
                break
            run = child.packed
            if pos + len(run) > end or not query.startswith(run, pos):
                path.append((child, _equal_pages(query, pos, end, run, step)))  # a part of it
                break
            path.append((child, len(run) // step))  # the whole node
            node, pos = child, pos + len(run)
        return path

    def add_child(self, parent: RadixNode, packed: bytes) -> RadixNode:
        """Attach a new node holding `packed` (whole pages) under `parent`; no key yet."""
        return self.attach(parent, packed, [])

    def attach(self, parent: RadixNode, packed: bytes, keys: list[bytes]) -> RadixNode:
        """Attach a node holding `packed` whose first `len(keys)` keys are known (warm restart
        knows them from the disk records)."""
        assert packed and len(packed) % self.page_bytes == 0, f"{len(packed)} bytes"
        num_pages = len(packed) // self.page_bytes
        assert len(keys) <= num_pages, f"{len(keys)} keys for {num_pages} pages"
        first = packed[: self.page_bytes]
        assert first not in parent.children, "a child with this first page already exists"
        node = RadixNode(parent, packed, num_pages, keys, parent.root_key, parent.residence.child)
        parent.children[first] = node
        self.num_nodes += 1
        return node

    def page_keys(self, node: RadixNode) -> list[bytes]:
        """Every page key of `node` (a page's key chains from the previous page's, the first
        from the parent's last or the namespace root's). Missing keys are computed now, after
        those of the ancestors they chain from."""
        if len(node.keys) < node.num_pages:
            missing = []
            current = node
            while current.parent is not None and len(current.keys) < current.num_pages:
                missing.append(current)
                current = current.parent
            for current in reversed(missing):  # parents first: each chains from the one above
                known = len(current.keys)
                start = current.keys[-1] if known else self.parent_key(current)
                rest = current.packed[known * self.page_bytes :]
                current.keys.extend(chain_packed_keys(start, rest, self.page_size))
        return node.keys

    def parent_key(self, node: RadixNode) -> bytes:
        """The key `node`'s first page chains from: its parent's last page's, or the root's."""
        parent = node.parent
        assert parent is not None, "a namespace root has no parent key"
        return parent.root_key if parent.parent is None else self.page_keys(parent)[-1]

    def split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages; return the new head (the node keeps the tail).

        The tail keeps its identity so lock holders and children stay valid; its residency
        record is cut at the same page (`NodeState.split_head`).
        """
        assert 0 < num_pages < node.num_pages, f"split {num_pages} of {node.num_pages}"
        assert node.parent is not None
        cut, step = num_pages * self.page_bytes, self.page_bytes
        record = node.residence
        head = RadixNode(
            node.parent,
            node.packed[:cut],
            num_pages,
            node.keys[:num_pages],
            node.root_key,
            lambda head: record.split_head(head, num_pages),
        )
        head.lock_count = node.lock_count
        head.last_access = node.last_access
        node.parent.children[head.packed[:step]] = head
        node.packed = node.packed[cut:]
        node.keys = node.keys[num_pages:]  # the known keys past the cut, if any
        node.num_pages -= num_pages
        node.parent = head
        head.children[node.packed[:step]] = node
        self.num_nodes += 1
        return head

    def can_merge(self, node: RadixNode) -> bool:
        """One child, no locks on either, their records alike (`NodeState.mergeable_with`),
        and the node not used since its child was (see `merge`)."""
        if node.parent is None or len(node.children) != 1:
            return False
        child = next(iter(node.children.values()))
        return (
            node.last_access <= child.last_access
            and not (node.lock_count or child.lock_count)
            and node.residence.mergeable_with(child.residence)
        )

    def merge(self, node: RadixNode) -> RadixNode:
        """Fold `node` into its only child (which survives, longer); `node` is detached.

        The run keeps the node's access time, the older of the two, and LRU order stays exact:
        the use that last touched the child touched its path just before it (one tick a node,
        down the path), so every tick between the two times belongs to an ancestor, which
        never leaves a tier before the run does. A node used since its child (through another
        child, since gone) is not merged: no one time would be exact for both runs, the
        child's pages would look younger than they are or the node's older."""
        assert self.can_merge(node) and node.parent is not None
        child = next(iter(node.children.values()))
        child.last_access = node.last_access
        child.packed = node.packed + child.packed
        # the child's keys continue the node's only if the node knows all of its own
        child.keys = node.keys + child.keys if len(node.keys) == node.num_pages else node.keys
        child.num_pages += node.num_pages
        child.residence.absorb_parent(node.residence)
        child.parent = node.parent
        node.parent.children[child.packed[: self.page_bytes]] = child
        node.children = {}
        node.attached = False
        self.num_nodes -= 1
        return child

    def remove(self, node: RadixNode) -> None:
        """Detach a childless node (its copies must already be freed); a namespace root left
        with no children goes too."""
        assert not node.children and node.parent is not None, "remove a leaf only"
        assert node.residence.empty(), f"remove {node} with copies"
        parent = node.parent
        del parent.children[node.packed[: self.page_bytes]]
        parent.residence.child_left()
        node.attached = False
        self.num_nodes -= 1
        if parent.parent is None and not parent.children:
            del self.roots[parent.root_key]
            self.names.pop(parent.root_key, None)

    def lock_path(self, node: RadixNode, delta: int) -> list[RadixNode]:
        """Add `delta` (+1/-1) to the lock count of `node` and its ancestors.

        Returns the nodes whose count crossed zero (their evictability changed)."""
        changed = []
        current: RadixNode | None = node
        while current is not None and current.parent is not None:
            count = current.lock_count + delta
            assert count >= 0, f"lock count below zero on {current}"
            current.lock_count = count
            if count == (1 if delta > 0 else 0):
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


def _equal_pages(query: bytes, pos: int, end: int, run: bytes, step: int) -> int:
    """How many leading pages of `run` equal `query`'s from byte `pos` (up to `end`), given
    that the first page does (the child was found by it) and not all of `run` does."""
    length = min(len(run), end - pos)
    if run.startswith(query[pos : pos + length]):
        return length // step
    low, high = 1, length // step  # pages [0, low) are equal; the first differing is < high
    while high - low > 1:
        mid = (low + high) // 2
        if query.startswith(run[low * step : mid * step], pos + low * step):
            low = mid
        else:
            high = mid
    return low

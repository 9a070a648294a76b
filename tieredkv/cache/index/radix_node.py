"""A radix tree node: a run of whole pages, and the record of where they live (opaque here).

A node holds page-aligned tokens (packed: int32 little-endian bytes, see `token_run`), the
chained keys of its pages once a page first needs one (`keys`, filled by `RadixTree.page_keys`),
its lock count and access time, and one record the residency layer keeps (`residence`: its
copies per tier, transfers in flight, pins, heap stamps). The index never reads that record:
where the tree's shape changes it calls the record's `NodeState` methods, so residency keeps
its counts as nodes are added, split, merged and removed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from tieredkv.cache.index.token_run import TOKEN_BYTES
from tieredkv.cache.tier import Tier


class NodeState(Protocol):
    """What the tree asks of a node's residency record (`residency.residence.Residence`)."""

    def child(self, node: RadixNode) -> NodeState:
        """The record of `node`, a new child of this record's node holding nothing yet."""

    def child_left(self) -> None:
        """A child holding nothing left this record's node."""

    def split_head(self, head: RadixNode, num_pages: int) -> NodeState:
        """Cut this record after `num_pages` pages: return `head`'s (the first pages; `head`
        takes this node's place under its parent), keep the rest."""

    def mergeable_with(self, child: NodeState) -> bool:
        """May this record's node fold into its only child, `child`'s node (same tiers and
        pins, nothing in flight on either)?"""

    def absorb_parent(self, parent: NodeState) -> None:
        """`parent`'s node folds into this one: its pages come first."""

    def empty(self) -> bool:
        """No copy and nothing in flight: the node may leave the tree."""

    def serve_into(self, pages: tuple[list[int], ...]) -> Tier | None:
        """Append the serving (fastest) copy's pages to `pages[tier]` and return its tier;
        None when there is no copy."""

    def device_pages(self) -> list[int] | None:
        """The committed device copy's pages, None without one."""

    def serving_gaps(self) -> frozenset[int]:
        """The pages (indexes in the node) whose serving copy lacks their sliding part."""

    def device_gaps(self) -> frozenset[int]:
        """The pages whose device copy lacks their sliding part."""


class RadixNode:
    """A run of whole pages. The namespace root holds no pages and is never evicted."""

    __slots__ = (
        "attached",
        "children",
        "keys",
        "last_access",
        "lock_count",
        "num_pages",
        "packed",
        "parent",
        "residence",
        "root_key",
    )

    def __init__(
        self,
        parent: RadixNode | None,
        packed: bytes,
        num_pages: int,
        keys: list[bytes],
        root_key: bytes,
        residence: Callable[[RadixNode], NodeState],
    ) -> None:
        """`residence` makes the node's record (from the parent's, or the tree's for a root)."""
        self.parent = parent
        self.packed = packed  # its tokens, int32 little-endian (TOKEN_BYTES per token)
        self.num_pages = num_pages
        # the chained keys of its first len(keys) pages: none until a page first needs one
        # (a disk record, a restart index), then all (`RadixTree.page_keys`)
        self.keys = keys
        self.root_key = root_key  # the namespace root's key
        self.children: dict[bytes, RadixNode] = {}  # by their first page's packed tokens
        self.lock_count = 0
        self.last_access = 0
        self.attached = True
        self.residence = residence(self)  # read by the residency layer only

    def __repr__(self) -> str:
        return f"RadixNode(pages={self.num_pages}, {self.residence}, locks={self.lock_count})"

    @property
    def num_tokens(self) -> int:
        return len(self.packed) // TOKEN_BYTES

    def page_packed(self, index: int, page_size: int) -> bytes:
        """Page `index`'s tokens, packed (a first page is its key in the parent's children)."""
        page_bytes = page_size * TOKEN_BYTES
        return self.packed[index * page_bytes : (index + 1) * page_bytes]

    def page_ids(self, index: int, page_size: int) -> tuple[int, ...]:
        """Page `index`'s token ids (disk records store ids)."""
        return struct.unpack(f"<{page_size}i", self.page_packed(index, page_size))

    def path(self) -> list[RadixNode]:
        """The nodes from the namespace root's child down to this node."""
        nodes = []
        node: RadixNode | None = self
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

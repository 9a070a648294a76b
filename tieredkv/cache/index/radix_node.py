"""A radix tree node: a run of whole pages, its copies per tier and its transfers in flight.

A node holds page-aligned tokens (packed: int32 little-endian bytes, see `token_run`), the
chained keys of its pages once a page first needs one (`keys`, filled by `RadixTree.page_keys`)
and, per tier, the page ids of its copy there (`copies`) and the transfer in flight towards a
tier (`inflight`). Copies and
transfers change only through `set_copy`/`pop_copy`/`set_inflight`/`pop_inflight`, which keep
the parent's per-rank child counts, so evictability checks are O(1) whatever the fan-out, and
the namespace's pages per tier (`usage`, one list shared by every node of a namespace, and
`arriving` for its copies in flight, which fair eviction reads:
`tieredkv.cache.residency.fair_share`).
"""

from __future__ import annotations

import struct
from typing import Protocol

from tieredkv.cache.index.token_run import TOKEN_BYTES
from tieredkv.cache.tier import Tier

NO_COPY = len(Tier)  # the closure rank of a node with no copy and nothing in flight


class PendingCopy(Protocol):
    """A copy of a node's pages on its way to a tier (the transfer layer's `TransferPart`).
    The index only cuts it in two when it splits the node."""

    src_tier: Tier

    def split_head(self, num_pages: int, head: RadixNode) -> PendingCopy: ...


class RadixNode:
    """A run of whole pages. The namespace root holds no pages and is never evicted."""

    __slots__ = (
        "arriving",
        "attached",
        "child_ranks",
        "children",
        "children_on_disk",
        "copies",
        "inflight",
        "keys",
        "last_access",
        "lock_count",
        "num_pages",
        "packed",
        "parent",
        "pin_count",
        "root_key",
        "stamps",
        "usage",
    )

    def __init__(
        self,
        parent: RadixNode | None,
        packed: bytes,
        num_pages: int,
        keys: list[bytes],
        root_key: bytes,
    ) -> None:
        self.parent = parent
        self.packed = packed  # its tokens, int32 little-endian (TOKEN_BYTES per token)
        self.num_pages = num_pages
        # the chained keys of its first len(keys) pages: none until a page first needs one
        # (a disk record, a restart index), then all (`RadixTree.page_keys`)
        self.keys = keys
        self.root_key = root_key  # the namespace root's key
        self.children: dict[bytes, RadixNode] = {}  # by their first page's packed tokens
        self.copies: dict[Tier, list[int]] = {}  # committed copies: page ids per tier
        self.inflight: dict[Tier, PendingCopy] = {}  # copies on their way, by destination tier
        self.lock_count = 0
        self.pin_count = 0  # pinned prefixes through this node: its host and disk copies stay
        self.last_access = 0
        self.stamps = [0] * len(Tier)  # per-tier heap entry versions (lazy deletion)
        # the namespace's committed pages per tier: the root's list, shared by all its nodes
        # (a split or a merge moves pages between two nodes of one namespace: no change)
        self.usage: list[int] = parent.usage if parent is not None else [0] * len(Tier)
        # and its pages on their way to each tier (copies in flight hold pool pages there too)
        self.arriving: list[int] = parent.arriving if parent is not None else [0] * len(Tier)
        self.attached = True
        # children per closure rank (their fastest tier, copies in flight counted; NO_COPY)
        # and children with a disk copy: evictability is O(1), whatever the fan-out
        self.child_ranks = [0] * (NO_COPY + 1)
        self.children_on_disk = 0

    def __repr__(self) -> str:
        tiers = ",".join(t.label for t in sorted(self.copies))
        return f"RadixNode(pages={self.num_pages}, copies=[{tiers}], locks={self.lock_count})"

    @property
    def is_root(self) -> bool:
        return self.parent is None

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

    def fastest_copy(self) -> Tier | None:
        """The tier that serves this node now (its fastest committed copy), None if none."""
        return min(self.copies) if self.copies else None

    # Copies and transfers change only through these four, which keep the parent's counts.

    def set_copy(self, tier: Tier, pages: list[int]) -> None:
        before = self.rank()
        self.usage[tier] += len(pages) - len(self.copies.get(tier, ()))
        self.copies[tier] = pages
        self._ranked(before)

    def pop_copy(self, tier: Tier) -> list[int]:
        before = self.rank()
        pages = self.copies.pop(tier)
        self.usage[tier] -= len(pages)
        self._ranked(before)
        return pages

    def set_inflight(self, tier: Tier, part: PendingCopy) -> None:
        before = self.rank()
        if tier not in self.inflight:
            self.arriving[tier] += self.num_pages
        self.inflight[tier] = part
        self._ranked(before)

    def pop_inflight(self, tier: Tier) -> PendingCopy:
        before = self.rank()
        part = self.inflight.pop(tier)
        self.arriving[tier] -= self.num_pages
        self._ranked(before)
        return part

    def rank(self) -> tuple[int, bool]:
        """(fastest tier with a copy or a copy in flight, or NO_COPY; has a disk copy)."""
        tiers = [*self.copies, *self.inflight]
        return (min(tiers) if tiers else NO_COPY, self.has_disk_copy())

    def _ranked(self, before: tuple[int, bool]) -> None:
        after = self.rank()
        if after != before and self.parent is not None:
            self.parent.child_ranks[before[0]] -= 1
            self.parent.child_ranks[after[0]] += 1
            self.parent.children_on_disk += after[1] - before[1]

    def any_child_in_closure(self, tier: Tier) -> bool:
        """Has a child a copy in `tier` or a faster tier (in flight counted)?"""
        return any(self.child_ranks[: tier + 1])

    def in_closure(self, tier: Tier) -> bool:
        """True if a copy in `tier` or a faster tier exists or is in flight towards one."""
        if self.parent is None:
            return True
        return any(t <= tier for t in self.copies) or any(t <= tier for t in self.inflight)

    def may_commit(self, tier: Tier) -> bool:
        """May this node commit a copy in `tier` now? Only once its parent has a committed copy
        in `tier` or a faster one (disk: a committed disk copy)."""
        parent = self.parent
        assert parent is not None
        if parent.parent is None:
            return True
        if tier is Tier.DISK:
            return Tier.DISK in parent.copies
        return any(t <= tier for t in parent.copies)

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

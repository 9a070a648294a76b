"""`Residence`: one node's record of where its pages live, the tree's `NodeState`.

Per tier, the page ids of the node's copy there (`copies`) and the transfer in flight towards a
tier (`inflight`, a `TransferPart`; `presence()` sums both up per tier), how many pinned
prefixes run through the node (`pin_count`), how many retained prefixes (`retain_count`,
`tieredkv.cache.retention`), and its heap entry versions (`stamps`, see
`eviction`). Copies and transfers change only through `set_copy`/`pop_copy`/`set_inflight`/
`pop_inflight`, which keep the parent's per-rank child counts (`child_ranks`,
`children_on_disk`), so evictability checks are O(1) whatever the fan-out, and the namespace's
pages per tier (`usage`, one list shared by every record of a namespace, and `arriving` for its
copies in flight, which fair eviction reads: `fair_share`). A copy may lack some pages' sliding
part (`sliding_gaps`: page indexes in the node, per tier; `sliding_pages`): a copy made from
another has its gaps, a request's own pages have none.
The tree calls the `NodeState` methods as it adds, splits, merges and removes nodes.
"""

from __future__ import annotations

import enum

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_queue import TransferPart

NO_COPY = len(Tier)  # the closure rank of a node with no copy and nothing in flight


class Presence(enum.Enum):
    """What a node has in one tier."""

    PRESENT = "present"  # a committed copy, staying
    ARRIVING = "arriving"  # a copy on its way (copying, or arrived and waiting for the parent)
    LEAVING = "leaving"  # a committed copy that a demotion in flight frees when applied


class Residence:
    """Where one node's pages live; read and written by the residency layer only."""

    __slots__ = (
        "arriving",
        "child_ranks",
        "children_on_disk",
        "copies",
        "inflight",
        "node",
        "pin_count",
        "retain_count",
        "sliding_gaps",
        "stamps",
        "usage",
    )

    def __init__(self, node: RadixNode, usage: list[int], arriving: list[int]) -> None:
        self.node = node
        self.copies: dict[Tier, list[int]] = {}  # committed copies: page ids per tier
        self.inflight: dict[Tier, TransferPart[RadixNode]] = {}  # on their way, by destination
        self.pin_count = 0  # pinned prefixes through the node: its host and disk copies stay
        self.retain_count = 0  # retained prefixes through it: its lowest local copy stays
        self.stamps = [0] * len(Tier)  # per-tier heap entry versions (lazy deletion)
        # per tier with a copy lacking some pages' sliding part: those pages' indexes
        self.sliding_gaps: dict[Tier, frozenset[int]] = {}
        # the namespace's committed pages per tier: the root's list, shared by all its records
        # (a split or a merge moves pages between two nodes of one namespace: no change)
        self.usage = usage
        self.arriving = arriving  # and its pages on their way to each tier (pool pages too)
        # children per closure rank (their fastest tier, copies in flight counted; NO_COPY)
        # and children with a disk copy: evictability is O(1), whatever the fan-out
        self.child_ranks = [0] * (NO_COPY + 1)
        self.children_on_disk = 0

    @classmethod
    def for_root(cls, node: RadixNode) -> Residence:
        """A namespace root's record: the namespace's page counts start here."""
        return cls(node, [0] * len(Tier), [0] * len(Tier))

    def __repr__(self) -> str:
        return f"copies=[{','.join(t.label for t in sorted(self.copies))}]"

    # --- what the tree asks (`NodeState`) --------------------------------------------------

    def child(self, node: RadixNode) -> Residence:
        self.child_ranks[NO_COPY] += 1
        return Residence(node, self.usage, self.arriving)

    def child_left(self) -> None:
        self.child_ranks[NO_COPY] -= 1

    def split_head(self, head: RadixNode, num_pages: int) -> Residence:
        """Copies and transfers in flight are cut at the same page; the head has this node's
        rank (so the parent's counts stand) and this node as its only child."""
        record = Residence(head, self.usage, self.arriving)
        record.copies = {tier: pages[:num_pages] for tier, pages in self.copies.items()}
        self.copies = {tier: pages[num_pages:] for tier, pages in self.copies.items()}
        gaps = self.sliding_gaps
        record.sliding_gaps = _nonempty(
            {t: {i for i in g if i < num_pages} for t, g in gaps.items()}
        )
        self.sliding_gaps = _nonempty(
            {t: {i - num_pages for i in g if i >= num_pages} for t, g in gaps.items()}
        )
        record.inflight = {t: part.split_head(num_pages, head) for t, part in self.inflight.items()}
        record.pin_count = self.pin_count
        record.retain_count = self.retain_count
        rank, on_disk = self.rank()
        record.child_ranks[rank] = 1
        record.children_on_disk = int(on_disk)
        return record

    def mergeable_with(self, child: Residence) -> bool:
        return (
            self.copies.keys() == child.copies.keys()
            and self.pin_count == child.pin_count
            and self.retain_count == child.retain_count
            and not (self.inflight or child.inflight)
        )

    def absorb_parent(self, parent: Residence) -> None:
        self.copies = {tier: parent.copies[tier] + pages for tier, pages in self.copies.items()}
        shift = parent.node.num_pages
        gaps = {
            tier: parent.sliding_gaps.get(tier, frozenset())
            | {i + shift for i in self.sliding_gaps.get(tier, ())}
            for tier in self.copies
        }
        self.sliding_gaps = _nonempty(gaps)

    def empty(self) -> bool:
        return not (self.copies or self.inflight)

    def serve_into(self, pages: tuple[list[int], ...]) -> Tier | None:
        copies = self.copies
        if not copies:
            return None
        tier = min(copies)
        pages[tier].extend(copies[tier])
        return tier

    def device_pages(self) -> list[int] | None:
        return self.copies.get(Tier.DEVICE)

    def serving_gaps(self) -> frozenset[int]:
        """The serving copy's gaps and those of copies on their way to a faster tier, which a
        promotion may wait for and read instead (a prefetch towards host)."""
        copies = self.copies
        if not copies:
            return frozenset()
        tier = min(copies)
        gaps = self.sliding_gaps.get(tier, frozenset())
        for dst, part in self.inflight.items():
            if dst < tier and part.sliding_gaps:
                gaps = gaps | part.sliding_gaps
        return gaps

    def device_gaps(self) -> frozenset[int]:
        return self.sliding_gaps.get(Tier.DEVICE, frozenset())

    # --- copies and transfers: only these four change them, keeping the parent's counts -----

    def set_copy(self, tier: Tier, pages: list[int], gaps: frozenset[int] = frozenset()) -> None:
        """`gaps`: the pages of the copy without their sliding part (none: all have it)."""
        before = self.rank()
        self.usage[tier] += len(pages) - len(self.copies.get(tier, ()))
        self.copies[tier] = pages
        self.set_gaps(tier, gaps)
        self._ranked(before)

    def set_gaps(self, tier: Tier, gaps: frozenset[int]) -> None:
        if gaps:
            self.sliding_gaps[tier] = gaps
        else:
            self.sliding_gaps.pop(tier, None)

    def pop_copy(self, tier: Tier) -> list[int]:
        before = self.rank()
        pages = self.copies.pop(tier)
        self.sliding_gaps.pop(tier, None)
        self.usage[tier] -= len(pages)
        self._ranked(before)
        return pages

    def set_inflight(self, tier: Tier, part: TransferPart[RadixNode]) -> None:
        before = self.rank()
        if tier not in self.inflight:
            self.arriving[tier] += self.node.num_pages
        self.inflight[tier] = part
        self._ranked(before)

    def pop_inflight(self, tier: Tier) -> TransferPart[RadixNode]:
        before = self.rank()
        part = self.inflight.pop(tier)
        self.arriving[tier] -= self.node.num_pages
        self._ranked(before)
        return part

    def rank(self) -> tuple[int, bool]:
        """(fastest tier with a copy or a copy in flight, or NO_COPY; has a disk copy)."""
        tiers = [*self.copies, *self.inflight]
        return (min(tiers) if tiers else NO_COPY, self.has_disk_copy())

    def _ranked(self, before: tuple[int, bool]) -> None:
        parent = self.node.parent
        after = self.rank()
        if after != before and parent is not None:
            counts = parent.residence
            counts.child_ranks[before[0]] -= 1
            counts.child_ranks[after[0]] += 1
            counts.children_on_disk += after[1] - before[1]

    # --- what is where ---------------------------------------------------------------------

    def presence(self) -> dict[Tier, Presence]:
        """Per tier where the node has pages: present, arriving or leaving."""
        leaving = {part.src_tier for part in self.inflight.values() if part.ticket.frees_source}
        found = {
            tier: Presence.LEAVING if tier in leaving else Presence.PRESENT for tier in self.copies
        }
        found.update(dict.fromkeys(self.inflight, Presence.ARRIVING))
        return found

    def fastest_copy(self) -> Tier | None:
        """The tier that serves the node now (its fastest committed copy), None if none."""
        return min(self.copies) if self.copies else None

    def copy_source(self, dst: Tier) -> Tier | None:
        """The copy that a background copy towards `dst` reads: the fastest, except that a
        store (disk, remote) is written from the host copy where there is one. A host page is
        one contiguous run of bytes that goes to the store in place or with one memcpy, while a
        device page is gathered layer by layer; and the device pool stays the model's."""
        if dst.is_store and Tier.HOST in self.copies:
            return Tier.HOST
        return self.fastest_copy()

    def any_child_in_closure(self, tier: Tier) -> bool:
        """Has a child a copy in `tier` or a faster tier (in flight counted)?"""
        return any(self.child_ranks[: tier + 1])

    def in_closure(self, tier: Tier) -> bool:
        """True if a copy in `tier` or a faster tier exists or is in flight towards one."""
        if self.node.parent is None:
            return True
        return any(t <= tier for t in self.copies) or any(t <= tier for t in self.inflight)

    def may_commit(self, tier: Tier) -> bool:
        """May the node commit a copy in `tier` now? Only once its parent has a committed copy
        in `tier` or a faster one (disk: a committed disk copy)."""
        parent = self.node.parent
        assert parent is not None
        if parent.parent is None:
            return True
        copies = parent.residence.copies
        if tier is Tier.DISK:
            return Tier.DISK in copies
        return any(t <= tier for t in copies)

    def has_disk_copy(self) -> bool:
        """A disk copy exists or is being written (the disk closure counts both)."""
        return self.node.parent is None or Tier.DISK in self.copies or Tier.DISK in self.inflight


def _nonempty(gaps: dict[Tier, set[int] | frozenset[int]]) -> dict[Tier, frozenset[int]]:
    return {tier: frozenset(pages) for tier, pages in gaps.items() if pages}

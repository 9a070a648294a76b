"""Residency: which tiers hold each node's pages, and the rules every change keeps.

Rules kept here (engine thread only):
  - A copy is committed only after its parent has a committed copy in the same or a faster
    tier (disk: a committed disk copy). A copy that arrives early waits (`PartState.ARRIVED`),
    so completions apply parents before children whatever order the workers finish in.
  - A failed copy frees its destination; whatever depended on it (children's copies in flight
    towards that tier, or disk copies below a bad record) is detached and freed too, so the
    closure invariants hold after every completion.
  - A demotion frees its source only when applied, and only if the node could still leave
    that tier (unlocked, no child needing it); otherwise the source stays as the serving copy.
  - A copy made from another lacks the sliding parts its source lacked when it started, and any
    the transfer did not carry (`TransferPart.sliding_gaps`).

Each node's record (`residence.Residence`, `node.residence`) keeps its copies and transfers;
this layer alone reads it. Starting transfers and applying their outcomes is
`node_transfers`'s; demotion and promotion use both through their methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.residency.eviction import LruEvictionPolicy, copy_may_leave
from tieredkv.cache.residency.fair_share import Claim, FairTierHeap, tier_heap
from tieredkv.cache.residency.page_events import PageEvents
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.transfer.transfer_queue import PartState, TransferPart

Commit = tuple[RadixNode, Tier]  # a copy committed in a tier


class Residency:
    """Commits and drops nodes' copies, keeps the per-tier heaps current, takes what the
    index reports (`TreeEvents`) and pins."""

    def __init__(
        self,
        tree: RadixTree,
        pools: TierPools,
        counters: CacheCounters,
        namespace_share: float | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """`namespace_share`: each namespace's share of the device and host tiers when they
        make room (`fair_share`; None: an equal part among the namespaces holding pages).
        `sliding_window`: the model's longest sliding window (None: no sliding layer)."""
        self.tree = tree
        self.sliding_window = sliding_window
        # the keys the disk's rebuilt chains hang from (`warm_restart`): a namespace's root, or
        # a page whose record was lost, which a live path may compute again
        self.rebuilt_roots: set[bytes] = set()
        self.pools = pools
        self.counters = counters
        self._policy = LruEvictionPolicy()
        self._heaps = {
            tier: tier_heap(tier, tree.roots, partial(pools.num_pages, tier), namespace_share)
            for tier in Tier
        }
        self._commits: list[Commit] = []  # since the last `take_commits`
        self.events: PageEvents | None = None  # told of every copy committed or freed

    # --- what is where ---------------------------------------------------------------------

    def path_held_in(self, node: RadixNode, tiers: tuple[Tier, ...]) -> bool:
        """Has every node of the path to `node` a committed copy in one of `tiers`?"""
        return all(any(t in n.residence.copies for t in tiers) for n in node.path())

    def path_missing(self, node: RadixNode, held: Tier, wanted: Tier) -> list[RadixNode]:
        """The nodes of the path to `node` with a copy in `held` and none in `wanted`, nor one
        on its way there."""
        return [
            n
            for n in node.path()
            if held in n.residence.copies
            and wanted not in n.residence.copies
            and wanted not in n.residence.inflight
        ]

    def namespace_usage(self, root: RadixNode) -> list[int]:
        """The committed pages per tier of the namespace rooted at `root` (index by tier)."""
        return root.residence.usage

    # --- heaps -----------------------------------------------------------------------------

    def evictable(self, node: RadixNode, tier: Tier) -> bool:
        """May `node`'s copy in `tier` leave it now, by demotion at least (see `eviction`)?"""
        return self._policy.evictable(node, tier)

    def pop_evictable(self, tier: Tier, claim: Claim | None = None) -> RadixNode | None:
        """The cheapest copy to evict from `tier` now (see `eviction` and `fair_share`: a
        `claim` for a namespace's optional copy may find none), or None."""
        heap = self._heaps[tier]
        if isinstance(heap, FairTierHeap):
            return heap.pop(self._policy.evictable, claim)
        return heap.pop(self._policy.evictable)

    def refresh(self, node: RadixNode | None) -> None:
        """Push `node` into the heap of every tier where it is evictable now."""
        if node is None or node.parent is None or not node.attached:
            return
        for tier in node.residence.copies:
            if self._policy.evictable(node, tier):
                self._heaps[tier].push(node, self._policy.priority(node, tier))

    def split(self, node: RadixNode, num_pages: int) -> RadixNode:
        """Cut `node` after `num_pages` pages (see `RadixTree.split`); returns the head."""
        head = self.tree.split(node, num_pages)
        self.refresh(head)
        return head

    # --- what the index reports (`TreeEvents`) ---------------------------------------------

    def adopt_device_copy(self, node: RadixNode, pages: list[int]) -> bool:
        record = node.residence
        if Tier.DEVICE in record.inflight or not record.may_commit(Tier.DEVICE):
            return False
        record.set_copy(Tier.DEVICE, pages)
        if self.events is not None:
            self.events.stored(node, Tier.DEVICE)
        self.refresh(node.parent)
        self.commit_waiting_children(node)
        return True

    def fill_device_gaps(self, node: RadixNode, pages: list[int]) -> bool:
        """Give `node`'s device copy the sliding parts it lacks from `pages` (a request's own
        pages for the node, which hold them); False (nothing done) without room for them."""
        record = node.residence
        gaps = sorted(record.device_gaps())
        theirs = record.copies[Tier.DEVICE]
        if not self.pools.device.fill_sliding([pages[i] for i in gaps], [theirs[i] for i in gaps]):
            return False
        record.set_gaps(Tier.DEVICE, frozenset())
        return True

    def new_device_copy(self, node: RadixNode, pages: list[int]) -> None:
        node.residence.set_copy(Tier.DEVICE, pages)
        if self.events is not None:
            self.events.stored(node, Tier.DEVICE)

    def found_copy(
        self, node: RadixNode, tier: Tier, pages: list[int], gaps: frozenset[int] = frozenset()
    ) -> None:
        node.residence.set_copy(tier, pages, gaps)
        if self.events is not None:
            self.events.stored(node, tier)

    def released(self, node: RadixNode) -> None:
        self.refresh(node)
        self.remove_if_empty(node, cascade=False)

    # --- pins and locks --------------------------------------------------------------------

    def pin(self, node: RadixNode, delta: int) -> None:
        """Pin (+1) or unpin (-1) the prefix that ends at `node` (see `tieredkv.cache.pins`):
        the pin count of `node` and of its ancestors changes; a count crossing zero changes
        the node's evictability."""
        self._count_along_path(node, delta, "pin_count")

    def retain(self, node: RadixNode, delta: int) -> None:
        """Retain (+1) or release (-1) the prefix that ends at `node` (see
        `tieredkv.cache.retention`): as `pin`, on the retain counts."""
        self._count_along_path(node, delta, "retain_count")

    def _count_along_path(self, node: RadixNode, delta: int, count: str) -> None:
        """Add `delta` to the `count` of `node` and its ancestors; a count crossing zero
        changes the node's evictability."""
        for path_node in node.path():
            record = path_node.residence
            value = getattr(record, count) + delta
            assert value >= 0, f"{count} below zero on {path_node}"
            setattr(record, count, value)
            if value == (1 if delta > 0 else 0):
                self.refresh(path_node)

    @staticmethod
    def pages_by_tier(ends: Iterable[RadixNode]) -> dict[Tier, int]:
        """The pages of the paths to `ends` per tier holding a copy (a node shared by two paths
        counts once)."""
        counts = dict.fromkeys(Tier, 0)
        seen: set[int] = set()
        for end in ends:
            for node in end.path():
                if id(node) not in seen:
                    seen.add(id(node))
                    for tier in node.residence.copies:
                        counts[tier] += node.num_pages
        return counts

    @contextmanager
    def pinned(self, node: RadixNode) -> Iterator[None]:
        """Keep `node`'s path out of eviction while room is made for its own transfer."""
        self.tree.lock_path(node, +1)
        try:
            yield
        finally:
            for changed in self.tree.lock_path(node, -1):
                self.refresh(changed)

    # --- committing arrived copies --------------------------------------------------------

    def try_commit(self, part: TransferPart[RadixNode]) -> None:
        """Commit an arrived copy if its parent's copies allow (else its parent's commit does)."""
        node, dst = part.node, part.dst_tier
        record = node.residence
        if not record.may_commit(dst):
            return  # the parent's copy commits first and then commits this one
        record.pop_inflight(dst)
        record.set_copy(dst, part.dst_pages, part.sliding_gaps)
        if self.events is not None:
            self.events.stored(node, dst)
        self._commits.append((node, dst))
        if part.ticket.frees_source:
            self._finish_demotion(node, part.src_tier)
        self.refresh(node)
        self.refresh(node.parent)
        self.commit_waiting_children(node)

    def take_commits(self) -> list[Commit]:
        """The copies committed since the last call."""
        commits, self._commits = self._commits, []
        return commits

    def commit_waiting_children(self, node: RadixNode) -> None:
        """Commit the children's arrived copies that `node`'s copies now allow."""
        for child in list(node.children.values()):
            for child_part in list(child.residence.inflight.values()):
                if child_part.state is PartState.ARRIVED:
                    self.try_commit(child_part)

    def _finish_demotion(self, node: RadixNode, src: Tier) -> None:
        """Free the demoted source if the node may still leave `src`; else keep it."""
        record = node.residence
        if src not in record.copies or node.lock_count:
            return
        if any(part.src_tier == src for part in record.inflight.values()):
            return
        if not copy_may_leave(record, src):
            return
        self.counters.on_eviction(src, node.num_pages, demoted=True)
        self.pools.free(src, record.pop_copy(src))
        if self.events is not None:
            self.events.removed(node, src)
        self.refresh(node.parent)

    def doom(self, part: TransferPart[RadixNode]) -> None:
        """Detach a part from its node; its destination is freed now or when it is applied."""
        part.node.residence.pop_inflight(part.dst_tier)
        if part.state is PartState.ARRIVED:
            self.pools.free(part.dst_tier, part.dst_pages)
        part.state = PartState.DETACHED

    # --- dropping copies -------------------------------------------------------------------

    def free_copy(self, node: RadixNode, tier: Tier, count_as: bool | None) -> None:
        """Free `node`'s copy in `tier`; copies being read from it are detached first and the
        pages freed only when those reads finish. `count_as`: demoted, dropped, or None."""
        record = node.residence
        pages = record.pop_copy(tier)
        if self.events is not None:
            self.events.removed(node, tier)
        readers = [part for part in record.inflight.values() if part.src_tier == tier]
        live = [part.ticket for part in readers if part.state is PartState.COPYING]
        for part in readers:
            self.doom(part)
        if live:
            live[0].release.append((tier, pages))
        else:
            self.pools.free(tier, pages)
        if count_as is not None:
            self.counters.on_eviction(tier, len(pages), demoted=count_as)

    def enforce_closure(self, node: RadixNode) -> None:
        """Detach or free whatever below `node` the closure invariants no longer allow."""
        record = node.residence
        for child in list(node.children.values()):
            copies = child.residence.copies
            for tier, part in list(child.residence.inflight.items()):
                allowed = record.has_disk_copy() if tier is Tier.DISK else record.in_closure(tier)
                if not allowed:
                    self.doom(part)
            kept = [
                tier
                for tier in copies
                if (Tier.DISK in record.copies if tier is Tier.DISK else record.in_closure(tier))
            ]
            for tier in list(copies):
                if tier not in kept:  # demoted iff the child keeps a copy below
                    self.free_copy(child, tier, count_as=any(t > tier for t in kept))
            self.enforce_closure(child)
            self.remove_if_empty(child, cascade=False, merge=False)
            self.refresh(child)

    def remove_if_empty(self, node: RadixNode, cascade: bool = True, merge: bool = True) -> bool:
        """Detach a node left with no copy, no transfer, no child, no lock and no pin; then try its
        parent (which may now be empty too, or mergeable with its last child). True if `node`
        left the tree (its parent, or the run it merged into, is refreshed)."""
        removed = False
        while node.attached and node.parent is not None:
            record = node.residence
            held = record.pin_count or record.retain_count
            if not record.empty() or held or node.children or node.lock_count:
                break
            parent = node.parent
            self.tree.remove(node)
            removed = True
            if merge and parent.parent is not None and self.tree.can_merge(parent):
                self.refresh(self.tree.merge(parent))
            else:
                self.refresh(parent)
            if not cascade:
                break
            node = parent
        return removed

    def drop(self, node: RadixNode, tier: Tier, count_as: bool | None, closure: bool) -> None:
        """Free `node`'s copy in `tier` (`free_copy`); with `closure`, whatever below relied
        on it too (`enforce_closure`). A node left empty leaves the tree; what stays is
        refreshed."""
        parent = node.parent
        self.free_copy(node, tier, count_as)
        if closure:
            self.enforce_closure(node)
        self.refresh(node)
        if not self.remove_if_empty(node):  # which refreshes what it leaves behind
            self.refresh(parent)

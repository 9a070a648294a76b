"""Taking back the sliding parts no window reads: from the device pool as sequences move on, and
from the remote store when a path's last lock goes.

A split device pool (`pools.split_device_pool`) allocates every page whole: a sequence computes
all its layers. Two kinds of readers need a page's sliding part afterwards, and once neither
does it is freed (the page joins its device copy's gaps, `Residence.sliding_gaps`):

  a running sequence   reads the keys of its window: those before `computed - W + 1` never
                       again (`DeviceSliding.passed`, after each insert; a node another lock
                       holds is left to the unlock, since its reader's position is unknown)
  a continuation       reads the window before a reuse point (`sliding_pages.tree_kept_sliding`)

So the device keeps the sliding parts of each running sequence's last window and of the
windows before the tree's reuse points, and the other layer pages hold other pages' layers. A
copy being read (a transfer from the device in flight) keeps its parts: it was started with
the gaps it had; once the transfer is applied the rule applies to it (`read_done`).

The remote store's sliding values are taken back the same way when a path's last lock goes
(`reclaim_remote`): a turn the chat has since extended is no reuse point any more.
"""

from __future__ import annotations

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.remote.remote_tier import RemoteTier
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.sliding_pages import unread_sliding
from tieredkv.cache.tier import Tier


class DeviceSliding:
    """The sliding parts of a split device pool, freed as no window reads them (engine
    thread)."""

    def __init__(self, residency: Residency, device: SplitDevicePool, window: int) -> None:
        self.residency = residency
        self.device = device
        self.window = window
        self.page_size = residency.tree.page_size
        # a walk of the whole tree when the device is short: once an eighth of its pages were
        # allocated since the last one
        self.reclaim_after = max(1, device.max_pages // 8)
        self._allocated_at_reclaim = 0

    def passed(self, end: RadixNode, computed: int) -> int:
        """The running sequence holding the lock on `end` has computed `computed` tokens of its
        path: free the sliding parts its window has passed where it is the only lock on the
        node and no reuse point reads them. Returns the parts freed."""
        limit = computed - self.window + 1  # its next queries read no key before this one
        freed, path = 0, end.path()
        starts, offset = [], 0
        for node in path:
            starts.append(offset)
            offset += node.num_tokens
        for node, start in zip(reversed(path), reversed(starts), strict=True):
            passed_pages = max(0, limit - start) // self.page_size
            if not passed_pages or node.lock_count != 1:
                continue
            freed += self._free(node, passed_pages)
            if len(node.residence.device_gaps()) == node.num_pages:
                break  # the nodes above were done by the earlier inserts
        return freed

    def unlocked(self, end: RadixNode) -> int:
        """The last lock on `end` went: free the path's sliding parts no reuse point reads."""
        return sum(self._free(node) for node in end.path() if not node.lock_count)

    def read_done(self, nodes: list[RadixNode]) -> int:
        """Transfers reading the device copies of `nodes` were applied: the parts they kept
        while being read go where no lock holds the node and no reuse point reads them."""
        return sum(self._free(node) for node in nodes if node.attached and not node.lock_count)

    def reclaim_if_due(self) -> int:
        """Before evicting device copies for room: free the sliding parts of unlocked copies
        that no reuse point reads, if enough was allocated since the last walk."""
        allocated = self.device.free_list.num_used
        if abs(allocated - self._allocated_at_reclaim) < self.reclaim_after:
            return 0
        self._allocated_at_reclaim = allocated
        tree = self.residency.tree
        return sum(self._free(node) for node in tree.iter_nodes() if not node.lock_count)

    def _free(self, node: RadixNode, num_pages: int | None = None) -> int:
        """Free the sliding parts of `node`'s first `num_pages` device pages (all) that hold
        one and that no reuse point reads."""
        record = node.residence
        pages = record.copies.get(Tier.DEVICE)
        if pages is None or _read_from(record, Tier.DEVICE):
            return 0
        gaps = record.device_gaps()
        end = node.num_pages if num_pages is None else min(num_pages, node.num_pages)
        held = (index for index in range(end) if index not in gaps)
        dropped = unread_sliding(node, held, self.window, self.page_size)
        if dropped:
            self.device.detach_sliding([pages[index] for index in dropped])
            record.set_gaps(Tier.DEVICE, gaps.union(dropped))
        return len(dropped)


def reclaim_remote(residency: Residency, remote: RemoteTier, end: RadixNode) -> None:
    """Delete from the remote store the sliding parts of the path's remote copies that no
    reuse point reads as the tree stands now (a turn the chat has since extended), as the
    split host pool takes its back (`SlidingRoom.reclaim`). Copies locked or being read keep
    theirs: a match was cut by the gaps it saw."""
    window, tree = residency.sliding_window, residency.tree
    assert window is not None
    for node in end.path():
        record = node.residence
        slots = record.copies.get(Tier.REMOTE)
        if slots is None or node.lock_count or _read_from(record, Tier.REMOTE):
            continue
        gaps = record.sliding_gaps.get(Tier.REMOTE, frozenset())
        if len(gaps) == node.num_pages:
            continue  # nothing left to take back (most of a long path, after a turn or two)
        held = (index for index in range(node.num_pages) if index not in gaps)
        dropped = unread_sliding(node, held, window, tree.page_size)
        if dropped:
            keys = tree.page_keys(node)
            remote.drop_sliding([keys[i] for i in dropped], [slots[i] for i in dropped])
            record.set_gaps(Tier.REMOTE, gaps.union(dropped))


def _read_from(record: Residence, tier: Tier) -> bool:
    """Is a transfer reading the record's copy in `tier`?"""
    return any(part.src_tier is tier for part in record.inflight.values())

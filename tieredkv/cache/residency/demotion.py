"""Making room in a tier: demote least recently used copies one tier down, drop only at the end.

Evicting a copy from tier T, cheapest first:
  1. it has a clean copy in a lower tier that is fast enough for its children: free it now
                                                                (counted demoted)
  2. it is a redundant copy of a node served from a faster tier: free it now  (dropped)
  3. a lower enabled, healthy tier has room now or soon (its own demotions are in flight):
     copy it there and free the source when the copy is applied (write-back); a disk copy
     writes the missing ancestors first. A tier that is full of locked or in-flight pages is
     skipped for the next one down.
  4. otherwise: free it now, with whatever below relied on it; a node left with no copy
     leaves the tree                                            (dropped)
     ... except while transfers are in flight and the drop would lose pages (the copy is the
     last one, or children would lose theirs) in a tier that has an enabled tier below: then
     wait, as those transfers complete, room opens below.
Write-through copies new device pages down in the background, so that eviction is case 1.
The remote tier is not "a lower copy" for these rules while a local tier below can take the
page: a remote copy alone would send the next hit to Redis instead of host or disk.
"""

from __future__ import annotations

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.eviction import copy_may_leave
from tieredkv.cache.residency.fair_share import Claim
from tieredkv.cache.residency.node_transfers import NodeTransfers
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.residency.sliding_reclaim import DeviceSliding, reclaim_remote
from tieredkv.cache.sliding_pages import REUSE_MARGIN_PAGES
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools


class Demoter:
    """Frees pages in a tier on demand (engine thread only)."""

    def __init__(
        self,
        pools: TierPools,
        residency: Residency,
        transfers: NodeTransfers,
        write_through: bool = False,
    ) -> None:
        self.pools = pools
        self.residency = residency
        self.transfers = transfers
        self.write_through_policy = write_through
        # a split device pool's sliding parts, freed as no window reads them (None: whole pages)
        self.device_sliding: DeviceSliding | None = None

    def make_room(self, tier: Tier, count: int, claimant: bytes | None = None) -> bool:
        """Try to have `count` free pages in `tier` now; `claimant`: the namespace root key of
        an optional copy the room is for (fair shares may then refuse it, see `fair_share`).

        Copies that can leave at once do; copies that must first move down start moving (they
        free their pages when applied, see `TieredCache.poll`). True if `count` are free now."""
        pools, residency = self.pools, self.residency
        claim = Claim(claimant, count) if claimant is not None else None
        if tier is Tier.DEVICE and self.device_sliding and count > pools.num_free(tier):
            self.device_sliding.reclaim_if_due()
        while (needed := count - pools.num_free(tier) - self.transfers.pending_free(tier)) > 0:
            node = residency.pop_evictable(tier, claim)
            if node is None:
                break
            if node.num_pages > needed:
                residency.split(node, node.num_pages - needed)  # evict the tail only
            if not self._evict(node, tier):
                self.residency.refresh(node)
                break
        return pools.num_free(tier) >= count

    def _serves_from_below(self, record: Residence, tier: Tier) -> bool:
        """Has the node a copy below `tier` that may serve once this one leaves? A local one,
        or the remote one when no local tier below `tier` takes copies: the remote tier is
        shared and slower than host or disk, so pages leave the device and host down the local
        tiers first (a page with only a remote copy below would come back from Redis, not
        disk)."""
        below = [t for t in record.copies if t > tier]
        if any(t is not Tier.REMOTE for t in below):
            return True
        return bool(below) and self.pools.lower(tier) in (None, Tier.REMOTE)

    def _evict(self, node: RadixNode, tier: Tier) -> bool:
        # a popped node has a copy in `tier`: min and max of its copies' tiers are defined
        record = node.residence
        if self._serves_from_below(record, tier) and copy_may_leave(record, tier):
            self.residency.drop(node, tier, count_as=True, closure=False)
            return True
        if record.fastest_copy() == tier:  # no faster copy: this one serves
            lower = self.pools.lower(tier)
            while lower is not None:
                if lower in record.copies or lower in record.inflight:
                    break  # its copy there is too low for its children: drop below instead
                if self.copy_down(node, lower, frees_source=True):
                    return True
                if self.transfers.pending_free(lower):
                    return False  # room is on its way there: wait for it
                lower = self.pools.lower(lower)
            if self.transfers.in_flight() and self._drop_loses_pages(record, tier):
                return False  # transfers in flight will change what can move: wait, lose nothing
        # demoted iff a copy remains below (a clean lower copy that was too low for children);
        # copies below that relied on this one go too
        self.residency.drop(node, tier, count_as=max(record.copies) > tier, closure=True)
        return True

    def _drop_loses_pages(self, record: Residence, tier: Tier) -> bool:
        """Would dropping the copy in `tier` (a tier above the last one) leave pages with no
        copy: the node's own (no lower copy) or its children's (they lose their closure)?"""
        if self.pools.lower(tier) is None:
            return False  # the last enabled, healthy tier: dropping is its job
        return not any(t > tier for t in record.copies) or not copy_may_leave(record, tier)

    def copy_down(self, node: RadixNode, lower: Tier, frees_source: bool) -> bool:
        """Start copying `node` to `lower`; for disk, its ancestors without a disk copy first.

        False if `lower` has no room now (its own demotions may have started)."""
        chain = [node]
        if lower is Tier.DISK:
            ancestor = node.parent
            while ancestor is not None and not ancestor.residence.has_disk_copy():
                if not ancestor.residence.copies:
                    return False  # an ancestor with nothing to write (its read failed)
                chain.append(ancestor)
                ancestor = ancestor.parent
            chain.reverse()
            self._drop_orphans_reached(chain)
        num_pages = sum(n.num_pages for n in chain)
        if num_pages > self.pools.num_free(lower):
            with self.residency.pinned(node):  # the chain's own lower copies must stay
                if not self.make_room(lower, num_pages, claimant=node.root_key):
                    return False
        # best effort: pages given no sliding part are gaps
        self.sliding_room_for(chain, num_pages, lower)
        if len(chain) > 1:  # the ancestors' sliding parts leave room for the node's full parts
            ancestors = chain[:-1]
            self.transfers.start_copy(ancestors, lower, False, reserve_pages=node.num_pages)
        self.transfers.start_copy([node], lower, frees_source=frees_source)
        return True

    def _drop_orphans_reached(self, chain: list[RadixNode]) -> None:
        """Before `chain` is written to disk: a page of it whose record a restart found lost
        has the chain the disk still holds after it hanging from its key, unmatched; that
        chain's copies go (as a flush would drop them), so no page is recorded twice. A
        namespace's root key is never a page's key."""
        orphans = self.residency.rebuilt_roots
        if not orphans:
            return
        tree = self.residency.tree
        for node in chain:
            for key in orphans.intersection(tree.page_keys(node)):
                orphans.discard(key)
                root = tree.roots.get(key)
                if root is not None:
                    self.flush([root])

    def sliding_room_for(
        self, chain: list[RadixNode], pages: int = 0, tier: Tier = Tier.HOST
    ) -> bool:
        """In a split host pool or disk store, free sliding parts for the pages of `chain` (a
        path's nodes, the deepest last) a copy to `tier` gives one (`sliding_room`) beside the
        full parts of `pages` pages still to be allocated, as far as copies may leave now: a
        demotion's, a prefetch's. True when there is room (always in a tier without layer
        pages); copies that must first move down free theirs later."""
        room = self.transfers.sliding_rooms.get(tier)
        if room is None:
            return True
        wanted = 0
        for node in chain:
            source = node.residence.copy_source(tier)
            record = node.residence
            gaps = frozenset() if source is None else record.sliding_gaps.get(source, frozenset())
            wanted += len(room.wanted(node, gaps))
        with self.residency.pinned(chain[-1]):
            return room.make_room(wanted, lambda victim: self._evict(victim, tier), pages)

    def write_through(self, node: RadixNode, tier: Tier) -> None:
        """After `node` got a copy in `tier`, start a background copy to the next tier down
        unless one exists or is on its way (write-through policy)."""
        record = node.residence
        lower = self.pools.lower(tier)
        if lower in (None, Tier.REMOTE) or not node.attached or lower in record.inflight:
            return  # remote copies are written at insert (`TieredCache`), whatever the policy
        local = [t for t in (*record.copies, *record.inflight) if t is not Tier.REMOTE]
        if any(t >= lower for t in local):
            return
        self.copy_down(node, lower, frees_source=False)

    def path_inserted(self, node: RadixNode) -> None:
        """After an insert left the path to `node`: with write-through, its device copies start
        down; and every page computed here starts towards the remote store for the other
        replicas, whatever the write policy (the path's device pages with no remote copy yet)."""
        if self.write_through_policy:
            for path_node in node.path():
                if Tier.DEVICE in path_node.residence.copies:
                    self.write_through(path_node, Tier.DEVICE)
        self._write_remote(node, settled_only=True)

    def path_unlocked(self, node: RadixNode) -> None:
        """After the last lock on `node` went: the pages of its path a running sequence kept
        from the remote store (`_settled`) start there, and the sliding parts no reuse point
        reads leave the remote store and the device (`sliding_reclaim`)."""
        if self._keeps_remote_parts():
            self._write_remote(node, settled_only=False)
            assert self.pools.remote is not None
            reclaim_remote(self.residency, self.pools.remote, node)
        if self.device_sliding is not None:
            self.device_sliding.unlocked(node)

    def _write_remote(self, node: RadixNode, settled_only: bool) -> None:
        if not self.pools.healthy(Tier.REMOTE):
            return
        missing = self.residency.path_missing(node, Tier.DEVICE, Tier.REMOTE)
        if settled_only:
            missing = self._settled(node, missing)
        if missing and self.make_room(Tier.REMOTE, sum(n.num_pages for n in missing)):
            self.transfers.start_copy(missing, Tier.REMOTE, frees_source=False)

    def _settled(self, end: RadixNode, nodes: list[RadixNode]) -> list[RadixNode]:
        """Of `nodes` (on the path to `end`, just inserted by a sequence that goes on), those
        whose remote copy is settled now. A remote tier that keeps sliding parts apart writes
        them where the rule keeps them as the tree stands (`sliding_pages.tree_kept_sliding`):
        within a window of the sequence's end, which moves on with every chunk and decoded
        page, so a node ending there waits until the sequence lets go of it (`path_unlocked`).
        Every node is settled for a tier that keeps whole pages."""
        window = self.residency.sliding_window
        if window is None or not self._keeps_remote_parts():
            return nodes
        page_size = self.residency.tree.page_size
        span = window - 1 + REUSE_MARGIN_PAGES * page_size
        ends, depth = {}, 0
        for path_node in end.path():
            depth += path_node.num_tokens
            ends[path_node] = depth
        return [node for node in nodes if ends[node] <= depth - span]

    def _keeps_remote_parts(self) -> bool:
        remote = self.pools.remote
        return remote is not None and remote.keeps_parts

    def keep_in_remote(self, node: RadixNode, ttl_s: float) -> None:
        """Give the path to `node` (a retained prefix) `ttl_s` to live in the remote store from
        now: an expiry for its pages there (set by the store's writer thread), and a copy of
        those with a device or host copy and no remote one, nor one on its way, written with
        it. Pages whose only copy is on disk are not written from here."""
        remote = self.pools.remote
        if remote is None:
            return
        path = node.path()
        remote.retain([key for n in path for key in self.residency.tree.page_keys(n)], ttl_s)
        if not self.pools.healthy(Tier.REMOTE):
            return  # the expiries wait for the store; the pages are written when next put
        missing = [
            n
            for n in path
            if Tier.REMOTE not in n.residence.copies
            and Tier.REMOTE not in n.residence.inflight
            and (Tier.DEVICE in n.residence.copies or Tier.HOST in n.residence.copies)
        ]
        if missing and self.make_room(Tier.REMOTE, sum(n.num_pages for n in missing)):
            self.transfers.start_copy(missing, Tier.REMOTE, frees_source=False)

    def forget_remote(self, node: RadixNode, keys: set[bytes]) -> bool:
        """Drop the remote copies, on the path to `node`, of the nodes holding a page of `keys`
        (pages the store no longer holds), unless locked or being read; True if any went."""
        forgot = False
        for path_node in node.path():
            record = path_node.residence
            if Tier.REMOTE not in record.copies or path_node.lock_count:
                continue
            if any(part.src_tier is Tier.REMOTE for part in record.inflight.values()):
                continue
            if keys.isdisjoint(self.residency.tree.page_keys(path_node)):
                continue
            self.residency.drop(path_node, Tier.REMOTE, count_as=None, closure=True)
            forgot = True
        return forgot

    def copy_path(self, node: RadixNode, tiers: list[Tier]) -> Tier | None:
        """Start copying each node of the path to `node` (parents first) to each of `tiers`
        where it has no copy and none on its way, from a faster copy (a pin's, a retained
        prefix's). Returns the first tier found with no room (the copies started stay), None
        when all started."""
        for path_node in node.path():
            record = path_node.residence
            for tier in tiers:
                if tier in record.copies or tier in record.inflight:
                    continue
                if not any(t < tier for t in record.copies):
                    continue  # nothing faster to copy from
                if not self.copy_down(path_node, tier, frees_source=False):
                    return tier
        return None

    def flush(self, roots: list[RadixNode] | None = None) -> int:
        """Drop every copy that may leave its tier now (locked and in-flight ones stay), in
        the whole tree or under `roots` only. Returns the number of pages dropped."""
        if roots is not None:
            return self._flush_under(roots)
        dropped = 0
        progress = True
        while progress:
            progress = False
            for tier in Tier:
                later = []  # children below still need this copy: they go first
                while node := self.residency.pop_evictable(tier):
                    if not copy_may_leave(node.residence, tier):
                        later.append(node)
                        continue
                    dropped += self._drop(node, tier)
                    progress = True
                for node in later:
                    self.residency.refresh(node)
        return dropped

    def _flush_under(self, roots: list[RadixNode]) -> int:
        nodes = [child for root in roots for child in root.children.values()]
        for node in nodes:  # parents before children
            nodes.extend(node.children.values())
        dropped = 0
        for node in reversed(nodes):  # children first: their parents' copies may then leave
            for tier in list(node.residence.copies):
                if not node.attached:
                    break
                if self.residency.evictable(node, tier) and copy_may_leave(node.residence, tier):
                    dropped += self._drop(node, tier)
        return dropped

    def _drop(self, node: RadixNode, tier: Tier) -> int:
        demoted = any(t > tier for t in node.residence.copies)
        self.residency.drop(node, tier, count_as=demoted, closure=False)
        return node.num_pages

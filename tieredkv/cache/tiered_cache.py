"""The tiered KV cache facade (made by `build.build_cache`): the one object the engine talks to.

Every method runs on the engine thread, the only writer of the tree, pools, locks and heaps;
transfer threads copy bytes and report, and `poll()` applies what they reported. The engine holds
one `CacheHandle(cache, namespace)` per request and never sees a node; the handle is built on
these node-level calls, which the cache's tests drive:
  match = cache.match(prompt, namespace)          # device, host, disk segments + the miss
  cache.lock(match.last_node); cache.prefetch(match)   # while queued: disk/remote -> host
  promo = cache.promote(match)                    # at admission; None: no room now, retry
  ... cache.poll() until promo.done; use promo.device_pages (promo.ready_len tokens)
  pages = cache.allocate(n)                       # private device pages for the suffix
  result = cache.insert(tokens, namespace, page_table)   # as full pages complete
  cache.free(result.duplicate_pages); cache.lock(result.node); cache.unlock(old)
  cache.unlock(node); cache.free(private pages no longer needed)   # finish / abort
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.flush_generations import FlushGenerations
from tieredkv.cache.index.match_results import InsertResult, MatchResult, PathEnd
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.index.token_run import TokenSequence, packed_bytes
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pins import Pin, Pinning, PinRegistry
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.remote.lookup import remote_keys_past
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.integrity import IntegrityResult, check_integrity
from tieredkv.cache.residency.node_transfers import NodeTransfers
from tieredkv.cache.residency.promotion import Promoter, PromotionTicket
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.retention import Retention
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.transfer.transfer_jobs import TransferJobs
from tieredkv.cache.transfer.transfer_queue import TransferQueue, TransferTicket
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.tenants import in_tenant

DEFAULT_NAMESPACE = "default"
PREFETCH_PAGES = 256


@dataclass(eq=False, repr=False)
class TieredCache:
    """KV pages in four tiers under one radix tree; each call delegates to the part owning it."""

    config: CacheConfig
    layout: PageLayout
    tree: RadixTree
    pools: TierPools
    counters: CacheCounters
    transfer_jobs: TransferJobs
    transfer_queue: TransferQueue
    residency: Residency
    transfers: NodeTransfers
    index: RadixIndex
    demoter: Demoter
    promoter: Promoter
    pinning: Pinning
    retention: Retention
    generations: FlushGenerations

    @property
    def page_size(self) -> int:
        return self.layout.page_size

    def match(self, tokens: TokenSequence, namespace: str = DEFAULT_NAMESPACE) -> MatchResult:
        """The longest cached prefix of `tokens` (ids, or `PackedTokens` packed once) in whole
        pages, reusing at most `len(tokens) - 1` tokens; marks the path recently used. A node
        being demoted or promoted is a hit in its source tier."""
        return self.index.match(tokens, namespace)

    @property
    def insert(self) -> Callable[..., InsertResult]:
        """Index a request's full pages: `RadixIndex.insert` (its parameters and result), after
        which the write policy's copies start (`Demoter.path_inserted`)."""
        return self.index.insert

    def look_up_remote(self, tokens: TokenSequence, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Index the pages past the local match that the remote store holds; returns how many."""
        remote = self.pools.remote
        if not (remote and self.config.enable_prefix_reuse and self.pools.healthy(Tier.REMOTE)):
            return 0
        match = self.index.match(tokens, namespace)
        query = packed_bytes(tokens)
        keys, gaps = remote_keys_past(remote, self.tree, match, query)
        if not keys:
            return 0
        last = match.last_node
        if last is not None:
            self.index.lock(last)  # making room must not take the path the pages hang from
        try:
            if not self.demoter.make_room(Tier.REMOTE, len(keys)):
                return 0
            slots = self.pools.alloc(Tier.REMOTE, len(keys))
            remote.note_gaps(slots[index] for index in gaps)
            if self.index.attach_found(query, namespace, match, keys, Tier.REMOTE, slots, gaps):
                return len(keys)
            self.pools.free(Tier.REMOTE, slots)
            return 0
        finally:
            if last is not None:
                self.index.unlock(last)

    def device_pages_held(self, pages: list[int]) -> int:
        """What device `pages` take, in whole pages: fewer where a split device pool freed their
        sliding parts."""
        device = self.pools.device
        if isinstance(device, SplitDevicePool):
            return device.held_page_equivalents(pages)
        return len(pages)

    def window_passed(self, node: PathEnd, computed: int) -> None:
        """A running sequence holding the lock on `node` computed `computed` tokens: the device
        frees the sliding parts its window passed that nothing else reads (a split pool)."""
        if self.demoter.device_sliding is not None:
            self.demoter.device_sliding.passed(node, computed)

    def lock(self, node: PathEnd) -> None:
        """Pin `node` and its ancestors: never evicted, demoted or merged until unlocked."""
        self.index.lock(node)

    def unlock(self, node: PathEnd) -> None:
        """Release one `lock(node)`."""
        self.index.unlock(node)

    def allocate(self, num_pages: int) -> list[int] | None:
        """`num_pages` free device pages for a request, all or none, demoting to make room; None
        if not free yet (demotions started: retry after `poll`) or never (all else locked)."""
        if not self.demoter.make_room(Tier.DEVICE, num_pages):
            return None
        pages = self.pools.alloc(Tier.DEVICE, num_pages)
        self.index.lend(pages)
        return pages

    def free(self, pages: Sequence[int]) -> None:
        """Return a request's private device pages (never pages the tree owns)."""
        self.index.reclaim(pages)
        self.pools.free(Tier.DEVICE, list(pages))

    def promote(self, match: MatchResult, hold_lock: bool = False) -> PromotionTicket | None:
        """Bring the match's lower pages to the device, once per admitted request (it credits
        hit tokens per tier), all device pages or none (None: retry after `poll`). The ticket
        locks the match until done; `hold_lock` hands the caller a lock on its `ready_node`."""
        return self.promoter.promote(match, hold_lock)

    def prefetch(self, match: MatchResult, max_pages: int = PREFETCH_PAGES) -> list[TransferTicket]:
        """Start moving up to `max_pages` of the match's disk or remote pages to host."""
        return self.promoter.prefetch(match, max_pages)

    def prefault_some(self) -> bool:
        """Fault in the next chunk of host memory (when idle); True while more remains."""
        return self.pools.host.prefault_some()

    def poll(self) -> list[PromotionTicket]:
        """Apply every finished transfer (engine thread); return promotions now done."""
        return self._apply_finished(start_write_through=True)

    def _apply_finished(self, start_write_through: bool) -> list[PromotionTicket]:
        finished: list[PromotionTicket] = []
        committed = []
        for ticket in self.transfer_queue.drain():
            committed += self.transfers.apply(ticket)
            finished.extend(self.promoter.transfer_applied(ticket))
            if ticket.src_tier is Tier.DEVICE and self.demoter.device_sliding is not None:
                # a copy being read kept its sliding parts: the rule may free them now
                self.demoter.device_sliding.read_done([part.node for part in ticket.parts])
        if start_write_through and self.config.write_policy is WritePolicy.WRITE_THROUGH:
            for node, tier in committed:
                if tier is not Tier.DEVICE:
                    self.demoter.write_through(node, tier)
        return finished

    def wait(self, timeout: float | None = None) -> list[PromotionTicket]:
        """Block until a transfer finishes (or `timeout`), then `poll()`."""
        if self.transfer_queue.in_flight:
            self.transfer_queue.wait(timeout)
        return self.poll()

    def transfers_in_flight(self) -> int:
        """Transfers started and not yet applied (demotions among them free pages soon)."""
        return len(self.transfer_queue.in_flight)

    def add_transfer_listener(self, notify: Callable[[], None]) -> None:
        """Call `notify()` (from a transfer thread) whenever a transfer finishes."""
        self.transfer_queue.add_listener(notify)

    def add_device_landing_listener(self, landed: Callable[[list[int]], None]) -> None:
        """Call `landed(pages)` (from a reading thread) whenever a store read has put pages'
        verified KV into the device pool, before their transfer is applied."""
        self.transfer_jobs.device_landing_listeners.append(landed)

    def evict(self, tier: Tier, num_pages: int) -> bool:
        """Free `num_pages` in `tier` (demoting; dropping at the last tier), never touching
        locked paths or copies in flight; True if they are free now."""
        return self.demoter.make_room(tier, num_pages)

    def flush(self, within: Callable[[str], bool] | None = None, tenant: str | None = None) -> int:
        """Drop every cached page not locked or in flight, in every tier (disk records too), or
        only in the namespaces `within` accepts (a `tenant`'s: its namespaces, unless `within`
        says otherwise); returns the number of pages dropped. A flush of every namespace, or a
        tenant's, also advances its flush generation (`FlushGenerations`): no copy left
        anywhere (locked, in flight, on disk under a root not yet named, on another replica or
        in Redis) is matched again."""
        if tenant is not None and within is None:
            within = lambda name: in_tenant(name, tenant)  # noqa: E731 - the tenant's scope
        if within is None or tenant is not None:
            self.generations.advance(tenant)
            self.pinning.release_flushed(within)
        names = self.tree.names
        roots = None if within is None else [self.tree.roots[k] for k in names if within(names[k])]
        dropped = self.demoter.flush(roots)
        events = self.residency.events
        if events is not None and within is None and not self.tree.roots:
            events.cleared()  # after each page's removal: the cache holds nothing now
        return dropped

    def pin(self, token_ids: Sequence[int], namespace: str = DEFAULT_NAMESPACE) -> Pin | None:
        """Keep the full pages of `token_ids` at least on host (and on disk); None when they are
        not all on the device or host (compute first); PinError when they may not be pinned."""
        return self.pinning.pin(token_ids, namespace)

    def unpin(self, token_ids: Sequence[int], namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Release a pin; False when `token_ids` were not pinned in `namespace`."""
        return self.pinning.unpin(token_ids, namespace)

    @property
    def pins(self) -> PinRegistry:
        return self.pinning.pins

    def hold_warm(self, node: PathEnd, delta: int) -> None:
        """Keep (+1) or stop keeping (-1) the path to `node` on host, as a pin without a budget."""
        self.residency.pin(node, delta)

    def check_integrity(self) -> IntegrityResult:
        """Reconcile page ownership, lock counts and the closure invariants (engine thread)."""
        return check_integrity(self.index, self.pools, list(self.transfer_queue.in_flight.values()))

    def tier_enabled(self, tier: Tier) -> bool:
        return self.pools.enabled(tier)

    def tier_healthy(self, tier: Tier) -> bool:
        """Enabled and not degraded (a degraded pool takes no new copies)."""
        return self.pools.healthy(tier)

    def tier_used_bytes(self, tier: Tier) -> int:
        """Allocated pages (copies, requests' pages, destinations in flight) in bytes."""
        return self.pools.used_bytes(tier)

    def tier_capacity_bytes(self, tier: Tier) -> int:
        return self.pools.capacity_bytes(tier)

    def tier_num_pages(self, tier: Tier) -> int:
        """The pages `tier` holds in all (a split host pool's are smaller than whole ones)."""
        return self.pools.num_pages(tier)

    def tier_max_pages(self, tier: Tier) -> int:
        """The most pages `tier` holds (`TierPools.max_pages`)."""
        return self.pools.max_pages(tier)

    def tier_parts_held(self, tier: Tier) -> tuple[int, int]:
        """(allocated pages, sliding parts among them) in `tier` (`TierPools.parts_held`)."""
        return self.pools.parts_held(tier)

    def disk_page_errors(self) -> dict[DiskErrorReason, int]:
        """Disk records or files refused, by reason; every reason present, 0 without a disk."""
        return self.pools.disk_page_errors()

    def remote_page_errors(self) -> dict[str, int]:
        """Remote values refused (corrupt, fingerprint, key) and calls failed (unavailable)."""
        return self.pools.remote_page_errors()

    def namespace_pages(self) -> dict[str, dict[str, int]]:
        """Each namespace's cached pages per enabled tier (GET /debug/cache); one known only
        from disk records at restart, by no name yet, is shown by the start of its root key."""
        return {
            self.tree.names.get(key, f"key:{key.hex()[:16]}"): {
                tier.label: self.residency.namespace_usage(root)[tier] for tier in self.pools
            }
            for key, root in self.tree.roots.items()
        }

    def remote_store_state(self) -> dict | None:
        """The remote store's counters, health and last error; None without the tier."""
        return self.pools.remote_store_state()

    def disk_direct_io(self) -> bool | None:
        """Whether the disk tier uses O_DIRECT; None without a disk tier."""
        return self.pools.disk_direct_io()

    def num_locks(self) -> int:
        """Locks held on paths, by requests and by promotions in progress."""
        return sum(self.index.lock_holders.values())

    @property
    def device_pool(self) -> DevicePool:
        return self.pools.device

    @property
    def host_pool(self) -> HostPool:
        return self.pools.host

    def close(self) -> None:
        """Finish and apply transfers in flight, stop the copy threads, close the stores."""
        self.transfer_queue.close()
        # the queue is closed: no write-through now (the disk stays closed under "parent of")
        self._apply_finished(start_write_through=False)
        self.transfer_jobs.close()
        self.generations.close()
        self.pools.close_stores()

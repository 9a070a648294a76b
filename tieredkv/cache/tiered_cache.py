"""The tiered KV cache facade: the one object the engine talks to.

Threads: every method runs on the engine thread, the only writer of the tree, pools, locks and
heaps. Mover threads copy bytes and report; `poll()` applies what they reported.

The engine holds one `CacheHandle` per request (`new_handle`; its life in `cache_handle.py`) and
never sees a node. The handle is built on these node-level calls, which the cache's tests drive:
  match = cache.match(prompt, namespace)          # device, host, disk segments + the miss
  cache.lock(match.last_node)                     # keep the path while queued
  cache.prefetch(match)                           # disk/remote -> host in the background
  promo = cache.promote(match)                    # at admission; None: no room now, retry
  ... cache.poll() until promo.done; use promo.device_pages (promo.ready_len tokens)
  pages = cache.allocate(n)                       # private device pages for the suffix
  result = cache.insert(tokens, namespace, page_table)   # as full pages complete
  cache.free(result.duplicate_pages); cache.lock(result.node); cache.unlock(old)
  cache.unlock(node); cache.free(private pages no longer needed)   # finish / abort
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.index.match_results import InsertResult, MatchResult, PathEnd
from tieredkv.cache.index.page_key import chain_packed_keys
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.index.token_run import TokenSequence, packed_bytes
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pins import Pin, PinError, PinRegistry
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.remote.connection import RemoteTimeouts
from tieredkv.cache.remote.record import RefusalReason
from tieredkv.cache.remote.remote_tier import RemoteTier
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.integrity import IntegrityResult, check_integrity
from tieredkv.cache.residency.node_transfers import NodeTransfers
from tieredkv.cache.residency.promotion import Promoter, PromotionTicket
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.residency.warm_restart import rebuild_from_disk
from tieredkv.cache.tier import Tier
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.transfer.executor import (
    CudaStreamTransferExecutor,
    ThreadTransferExecutor,
    TransferExecutor,
)
from tieredkv.cache.transfer.mover import Mover, TransferTicket
from tieredkv.cache.transfer.page_copier import PageCopier
from tieredkv.config import CacheConfig, WritePolicy

DEFAULT_NAMESPACE = "default"
DEFAULT_PREFETCH_PAGES = 256
REMOTE_ERROR_REASONS = (*(reason.value for reason in RefusalReason), "unavailable")
IO_WORKERS = 4  # disk and remote transfers at once
REMOTE_LOOKUP_MAX_PAGES = 512  # pages one look-up asks the remote store for (8k tokens at 16)


def _default_memory_executor(device: torch.device) -> TransferExecutor:
    if device.type == "cuda":
        return CudaStreamTransferExecutor(num_workers=2, device=device)
    return ThreadTransferExecutor(num_workers=2, name="tkv-copy")


class TieredCache:
    """Device, host and disk KV pages indexed by one radix tree (see docs/architecture.md).

    `fingerprint` identifies the model (weights, tokenizer, dtype, layout, page size); it roots
    every namespace's key chain. With `config.disk_enabled`, the disk store is opened (its
    directory locked; DiskStoreError if it cannot be) and its records are indexed again, so
    their prefixes match in the disk tier. Executors and the clock can be replaced (tests).
    """

    def __init__(
        self,
        config: CacheConfig,
        layout: PageLayout,
        fingerprint: bytes,
        device: torch.device | str = "cpu",
        *,
        disk_io: DiskIOBackend | None = None,
        memory_executor: TransferExecutor | None = None,
        disk_executor: TransferExecutor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.layout = layout
        self.page_size = layout.page_size
        self.fingerprint = fingerprint
        self.write_policy = config.write_policy
        device = torch.device(device)
        disk = None
        if config.disk_enabled:
            assert config.disk_cache_dir is not None
            disk = DiskStore(
                config.disk_cache_dir, fingerprint, layout, config.disk_cache_bytes, io=disk_io
            )
        remote = None
        if config.remote_enabled:
            assert config.remote_cache_url is not None
            store = RemoteStore(
                config.remote_cache_url,
                fingerprint,
                layout.page_size,
                layout.page_bytes,
                config.remote_compression,
                config.remote_password,
                timeouts=RemoteTimeouts().scaled(config.remote_budget_scale),
            )
            remote = RemoteTier(store, layout)
        self.pools = TierPools(
            DevicePool.from_bytes(layout, config.device_cache_bytes, device),
            HostPool.from_bytes(layout, config.host_cache_bytes),
            disk,
            remote,
        )
        self.tree = RadixTree(self.page_size, Residence.for_root)
        self.counters = CacheCounters()
        self.copier = PageCopier(self.pools.device, self.pools.host, disk, remote=remote)
        self.mover = Mover(
            memory_executor or _default_memory_executor(device),
            disk_executor or self._default_io_executor(),
            clock,
        )
        self.residency = Residency(
            self.tree, self.pools, self.counters, namespace_share=config.namespace_share
        )
        self.transfers = NodeTransfers(self.residency, self.copier, self.mover, clock)
        self.index = RadixIndex(self.tree, fingerprint, config.enable_prefix_reuse, self.residency)
        self.demoter = Demoter(self.pools, self.residency, self.transfers)
        self.promoter = Promoter(
            self.residency, self.transfers, self.demoter, self.index, self.counters, clock
        )
        if disk is not None:
            rebuild_from_disk(self.tree, disk, self.residency)
        budget = config.pin_budget_bytes
        if budget is None:  # a quarter of the host tier
            budget = config.host_cache_bytes // 4
        self.pins = PinRegistry(
            budget // layout.page_bytes, config.disk_cache_dir if disk is not None else None
        )

    def _default_io_executor(self) -> ThreadTransferExecutor:
        """Four I/O workers. With a store below host they start now, each with its staging
        buffers faulted in (a store read lands in them on its way to the device): 4 x 96 MiB
        (three slots of 32 MiB) resident from the start. A first touch of fresh memory costs a
        page fault per 4 KiB page, far slower than a copy into resident memory on a VM that
        hands freed memory back to its host; faulting the buffers in at start keeps that cost
        out of the first promotion from disk or Redis."""
        stores = self.copier.stores
        if not stores:
            return ThreadTransferExecutor(num_workers=IO_WORKERS, name="tkv-disk")
        staging, pages = self.copier.staging, self.copier.stage_pages
        return ThreadTransferExecutor(
            num_workers=IO_WORKERS, name="tkv-disk", warm=lambda: staging.prefault(pages)
        )

    def new_handle(self, namespace: str = DEFAULT_NAMESPACE) -> CacheHandle:
        """A request's hold on the cache in `namespace`, holding nothing yet."""
        return CacheHandle(self, namespace)

    # --- matching and inserting ------------------------------------------------------------

    def match(self, tokens: TokenSequence, namespace: str = DEFAULT_NAMESPACE) -> MatchResult:
        """The longest cached prefix of `tokens` in `namespace`, in whole pages, reusing at most
        `len(tokens) - 1` tokens. Marks the path recently used. A node being demoted is a hit in
        its source tier; a node being promoted is a hit in its source tier too.

        `tokens` are ids, or `PackedTokens` (what the tree compares: a caller that matches the
        same sequence several times packs it once; ids are packed on every call)."""
        return self.index.match(tokens, namespace)

    def insert(
        self,
        tokens: TokenSequence,
        namespace: str,
        device_pages: Sequence[int],
        *,
        start_node: PathEnd | None = None,
        start_pages: int = 0,
    ) -> InsertResult:
        """Index the full pages of `tokens` (ids or `PackedTokens`, as for `match`) whose KV is
        in `device_pages` (the request's page table, one device page per full page; pages
        already the tree's stay so). Leading pages the tree already has are reported, not
        replaced: see `InsertResult`. Pages the tree takes stop being the caller's. Does not
        lock: lock `result.node` next.

        `start_node` (a node the caller holds locked, in `namespace`) and `start_pages` say the
        first `start_pages` pages of `tokens` are the path ending at `start_node`: the walk
        goes on from there instead of comparing those pages again. The result is the same as
        without them; a node whose depth is not `start_pages` is a programming error."""
        result = self.index.insert(tokens, namespace, device_pages, start_node, start_pages)
        if self.write_policy is WritePolicy.WRITE_THROUGH and result.node is not None:
            self.demoter.write_through_path(result.node)
        if result.node is not None and self.pools.healthy(Tier.REMOTE):
            self._write_remote_path(result.node)
        return result

    def look_up_remote(self, tokens: TokenSequence, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Past the local match, the next pages of `tokens` that the remote store holds (one
        round trip) join the tree as remote copies, to be promoted like disk pages. Returns
        how many; 0 without a healthy remote tier."""
        remote = self.pools.remote
        if remote is None or not self.pools.healthy(Tier.REMOTE):
            return 0
        match = self.index.match(tokens, namespace)
        max_pages = max(match.num_tokens - 1, 0) // self.page_size
        wanted = min(max_pages - match.num_pages, REMOTE_LOOKUP_MAX_PAGES)
        if wanted <= 0 or not self.config.enable_prefix_reuse:
            return 0
        query = packed_bytes(tokens)
        last = match.last_node
        parent_key = match.namespace_key if last is None else self.tree.page_keys(last)[-1]
        page_bytes = self.tree.page_bytes
        start = match.num_pages * page_bytes
        keys = chain_packed_keys(
            parent_key, query[start : start + wanted * page_bytes], self.page_size
        )
        found = remote.lookup(keys)
        if not found:
            return 0
        if last is not None:
            self.index.lock(last)  # making room must not take the path the pages hang from
        try:
            if not self.demoter.make_room(Tier.REMOTE, found):
                return 0
            slots = self.pools.alloc(Tier.REMOTE, found)
            if self.index.attach_found(query, namespace, match, keys[:found], Tier.REMOTE, slots):
                return found
            self.pools.free(Tier.REMOTE, slots)
            return 0
        finally:
            if last is not None:
                self.index.unlock(last)

    def lock(self, node: PathEnd) -> None:
        """Pin `node` and its ancestors: never evicted, demoted or merged until unlocked."""
        self.index.lock(node)

    def unlock(self, node: PathEnd) -> None:
        """Release one `lock(node)`."""
        self.index.unlock(node)

    # --- device pages for requests ---------------------------------------------------------

    def allocate(self, num_pages: int) -> list[int] | None:
        """`num_pages` free device pages for a request, all or none. Demotes least recently
        used pages to make room; None if they are not free yet (demotions started: retry after
        `poll`) or cannot be (everything else locked)."""
        if not self.demoter.make_room(Tier.DEVICE, num_pages):
            return None
        pages = self.pools.alloc(Tier.DEVICE, num_pages)
        self.index.lend(pages)
        return pages

    def free(self, pages: Sequence[int]) -> None:
        """Return a request's private device pages (never pages the tree owns)."""
        self.index.reclaim(pages)
        self.pools.free(Tier.DEVICE, list(pages))

    # --- moving pages ----------------------------------------------------------------------

    def promote(self, match: MatchResult, hold_lock: bool = False) -> PromotionTicket | None:
        """Bring the match's host and disk pages to the device; call once per admitted request
        (it credits hit tokens per tier). Allocates every device page needed or none: None means
        no room now (demotions may have started; retry after `poll`). The ticket locks the match
        until done; an already-resident match gives a ticket that is done at once. With
        `hold_lock`, the done ticket hands the caller a lock on `ticket.ready_node`."""
        return self.promoter.promote(match, hold_lock)

    def prefetch(
        self, match: MatchResult, max_pages: int = DEFAULT_PREFETCH_PAGES
    ) -> list[TransferTicket]:
        """Start moving up to `max_pages` of the match's disk or remote pages to host (no
        wait)."""
        return self.promoter.prefetch(match, max_pages)

    def prefault_some(self) -> bool:
        """Fault in the next chunk of the host tier's memory (the engine thread, when it has
        nothing else to do: see `pools/prefault.py`); True while more remains."""
        return self.pools.host.prefault_some()

    def poll(self) -> list[PromotionTicket]:
        """Apply every finished transfer (engine thread); return promotions now done."""
        return self._apply_finished(start_write_through=True)

    def _apply_finished(self, start_write_through: bool) -> list[PromotionTicket]:
        finished: list[PromotionTicket] = []
        committed = []
        for ticket in self.mover.drain():
            committed += self.transfers.apply(ticket)
            finished.extend(self.promoter.transfer_applied(ticket))
        if start_write_through and self.write_policy is WritePolicy.WRITE_THROUGH:
            for node, tier in committed:
                if tier is not Tier.DEVICE:
                    self.demoter.write_through(node, tier)
        return finished

    def wait(self, timeout: float | None = None) -> list[PromotionTicket]:
        """Block until a transfer finishes (or `timeout`), then `poll()`."""
        if self.mover.in_flight:
            self.mover.wait(timeout)
        return self.poll()

    def transfers_in_flight(self) -> int:
        """Transfers started and not yet applied (demotions among them free pages soon)."""
        return len(self.mover.in_flight)

    def add_transfer_listener(self, notify: Callable[[], None]) -> None:
        """Call `notify()` (from a mover thread) whenever a transfer finishes: the engine
        thread sleeps on one event for both new requests and finished transfers."""
        self.mover.add_listener(notify)

    def add_device_landing_listener(self, landed: Callable[[list[int]], None]) -> None:
        """Call `landed(pages)` (from a reading thread) whenever a store read has put pages'
        verified KV into the device pool, before their transfer is applied."""
        self.copier.device_landing_listeners.append(landed)

    def evict(self, tier: Tier, num_pages: int) -> bool:
        """Make `num_pages` free in `tier` (demoting, or dropping at the last tier); True if
        they are free now. Locked paths and copies in flight are never touched."""
        return self.demoter.make_room(tier, num_pages)

    def flush(self, within: Callable[[str], bool] | None = None) -> int:
        """Drop every cached page that is not locked or in flight, in every tier (the disk
        records too); with `within`, only in the namespaces it accepts (those named by a
        match or insert since the start). Returns the number of pages dropped."""
        if within is None:
            return self.demoter.flush()
        names = self.tree.names
        return self.demoter.flush([self.tree.roots[key] for key in names if within(names[key])])

    # --- pinned prefixes (see `pins`) -------------------------------------------------------

    def pin(self, token_ids: Sequence[int], namespace: str = DEFAULT_NAMESPACE) -> Pin | None:
        """Pin the full pages of `token_ids`: from now on at least on host (and copied to disk
        when there is one). None when the tree does not hold them all on the device or host
        (compute the prompt first); PinError when it may not be pinned."""
        pin = self.pins.get(namespace, token_ids)
        if pin is not None and pin.node is not None:
            return pin  # pinned already
        if not self.config.host_enabled:
            raise PinError("pinning needs a host tier (--host-cache-size)", "prompt", "no_host")
        num_pages = len(token_ids) // self.page_size
        if num_pages == 0:
            message = f"a pinned prompt needs at least one full page ({self.page_size} tokens)"
            raise PinError(message, "prompt", "prompt_too_short")
        used = self.pins.pages_in(namespace, besides=pin)
        if used + num_pages > self.pins.budget_pages:
            message = (
                f"pinning {num_pages} pages would exceed this namespace's pin budget "
                f"({used} of {self.pins.budget_pages} pages pinned)"
            )
            raise PinError(message, "prompt", "pin_budget_exceeded")
        node = self.index.full_path(token_ids, namespace)
        if node is None or not self.residency.path_held_in(node, (Tier.DEVICE, Tier.HOST)):
            return None
        self.residency.pin(node, +1)
        tiers = [tier for tier in (Tier.HOST, Tier.DISK) if self.tier_enabled(tier)]
        if (full := self.demoter.copy_path(node, tiers)) is not None:
            self.residency.pin(node, -1)
            message = f"the {full.label} tier has no room for this prefix"
            raise PinError(message, "prompt", "tier_full")
        pin = pin or Pin(namespace, tuple(token_ids), num_pages)
        pin.node = node
        self.pins.add(pin)
        return pin

    def unpin(self, token_ids: Sequence[int], namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Release a pin; False when `token_ids` were not pinned in `namespace`."""
        pin = self.pins.get(namespace, token_ids)
        if pin is None:
            return False
        if pin.node is not None:
            self.residency.pin(pin.node, -1)
        self.pins.remove(pin)
        return True

    def hold_warm(self, node: PathEnd, delta: int) -> None:
        """Keep (+1) or stop keeping (-1) the path to `node` on host as a pin does, without a
        registry entry or budget: a conversation's pages during its think time."""
        self.residency.pin(node, delta)

    def _write_remote_path(self, node: PathEnd) -> None:
        """Every page computed here is written for the other replicas (whatever the write
        policy): the path's device pages that have no remote copy yet start towards it."""
        missing = self.residency.path_missing(node, Tier.DEVICE, Tier.REMOTE)
        if missing and self.demoter.make_room(Tier.REMOTE, sum(n.num_pages for n in missing)):
            self.transfers.start_copy(missing, Tier.REMOTE, frees_source=False)

    # --- inspection ------------------------------------------------------------------------

    def check_integrity(self) -> IntegrityResult:
        """Reconcile page ownership, lock counts and the closure invariants (engine thread)."""
        return check_integrity(self.index, self.pools, list(self.mover.in_flight.values()))

    def tier_enabled(self, tier: Tier) -> bool:
        return self.pools.enabled(tier)

    def tier_healthy(self, tier: Tier) -> bool:
        """False for a disabled tier and for a degraded one (its pool takes no new copies)."""
        return self.pools.healthy(tier)

    def tier_used_bytes(self, tier: Tier) -> int:
        """Allocated pages (copies, requests' pages, destinations in flight) in bytes."""
        return self.pools.used_bytes(tier)

    def tier_capacity_bytes(self, tier: Tier) -> int:
        return self.pools.capacity_bytes(tier)

    def disk_page_errors(self) -> dict[DiskErrorReason, int]:
        """Disk records or files refused, by reason; every reason present, 0 without a disk."""
        disk = self.pools.disk
        return dict(disk.error_counts) if disk else dict.fromkeys(DiskErrorReason, 0)

    def remote_page_errors(self) -> dict[str, int]:
        """Remote values refused by reason (corrupt, fingerprint, key) and calls that failed
        or ran past their budget (unavailable); every reason present, 0 without the tier."""
        remote = self.pools.remote
        if remote is None:
            return dict.fromkeys(REMOTE_ERROR_REASONS, 0)
        counters = remote.store.counters()
        return {**counters.refused, "unavailable": counters.errors}

    def namespace_pages(self) -> dict[str, dict[str, int]]:
        """Each namespace's cached pages per enabled tier: what fair eviction weighs against its
        share (GET /debug/cache). A namespace known only from disk records at restart, by no
        name yet, is shown by the start of its root key."""
        return {
            self.tree.names.get(key, f"key:{key.hex()[:16]}"): {
                tier.label: self.residency.namespace_usage(root)[tier] for tier in self.pools
            }
            for key, root in self.tree.roots.items()
        }

    def remote_store_state(self) -> dict | None:
        """The remote store's counters, health and last error (GET /debug/cache); None
        without the remote tier."""
        remote = self.pools.remote
        if remote is None:
            return None
        counters = dataclasses.asdict(remote.store.counters())
        return {**counters, "degraded": remote.degraded, "last_error": remote.store.last_error}

    def disk_direct_io(self) -> bool | None:
        """Whether the disk tier uses O_DIRECT; None without a disk tier."""
        return None if self.pools.disk is None else self.pools.disk.direct_io

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
        """Let transfers in flight finish and apply them, stop the copy threads, then close the
        disk store (its records stay for the next start)."""
        self.mover.close()
        # no new copies once the mover is closed: what write-through would start now has no
        # executor to run on (the disk stays closed under "parent of": nothing more is written)
        self._apply_finished(start_write_through=False)
        self.copier.close()
        if self.pools.disk is not None:
            self.pools.disk.close()
        if self.pools.remote is not None:
            self.pools.remote.close()

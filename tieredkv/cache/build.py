"""`build_cache`: the tiered cache's composition root.

It opens the stores the configuration enables (the disk store's directory locked, the remote
store connected), makes the pools, the tree, the transfer jobs and the transfer
queue with its executors, and the residency, index, demotion, promotion and pinning over them;
the disk's records are indexed again before the facade is handed out. Nowhere else does the
library build them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.split_store import SplitDiskStore
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.flush_generations import FlushGenerations
from tieredkv.cache.index.radix_index import RadixIndex
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_listener import PageListener
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pins import Pinning, PinRegistry
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.remote.connection import RemoteTimeouts
from tieredkv.cache.remote.remote_tier import RemoteTier
from tieredkv.cache.remote.shared_generations import SharedGenerations
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.residency.demotion import Demoter
from tieredkv.cache.residency.node_transfers import NodeTransfers
from tieredkv.cache.residency.page_events import PageEvents
from tieredkv.cache.residency.promotion import Promoter
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.residency.sliding_reclaim import DeviceSliding
from tieredkv.cache.residency.warm_restart import rebuild_from_disk
from tieredkv.cache.retention import Retention
from tieredkv.cache.sliding_pages import LayerKinds
from tieredkv.cache.tier_pools import TierPools
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.cache.transfer.executors import (
    CudaStreamTransferExecutor,
    ThreadTransferExecutor,
    TransferExecutor,
)
from tieredkv.cache.transfer.transfer_jobs import TransferJobs
from tieredkv.cache.transfer.transfer_queue import TransferQueue
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.model_config import ModelConfig

log = logging.getLogger(__name__)

IO_WORKERS = 4  # disk and remote transfers at once


def build_cache(
    config: CacheConfig,
    layout: PageLayout,
    fingerprint: bytes,
    device: torch.device | str = "cpu",
    *,
    disk_io: DiskIOBackend | None = None,
    memory_executor: TransferExecutor | None = None,
    disk_executor: TransferExecutor | None = None,
    clock: Callable[[], float] = time.monotonic,
    page_listener: PageListener | None = None,
    model: ModelConfig | None = None,
) -> TieredCache:
    """The tiered cache for `config` (see docs/architecture.md).

    `fingerprint` identifies the model (weights, tokenizer, dtype, layout, page size); it roots
    every namespace's key chain. With `config.disk_enabled`, the disk store is opened (its
    directory locked; DiskStoreError if it cannot be) and its records are indexed again, so
    their prefixes match in the disk tier. Executors and the clock can be replaced (tests).
    `page_listener` hears of every page landing in or leaving a local tier (`page_listener`):
    first that none is held, then the disk's rebuilt pages. `model`'s sliding-window layers,
    if any, bring in the sliding-page rule (`sliding_pages`), a remote tier that stores the
    sliding part only where the rule keeps it (`remote.part_values`), and a host pool and a
    disk store that keep sliding parts only where the rule does (`_host_pool`, `_open_disk`).
    """
    device = torch.device(device)
    parts = None if model is None else PageParts.of(model, layout)
    disk = _open_disk(config, layout, fingerprint, disk_io, parts)
    remote = _open_remote(config, layout, fingerprint, parts)
    sliding_window = None if model is None else LayerKinds.of(model, layout).window
    pools = TierPools(
        _device_pool(config, layout, parts, device),
        _host_pool(config, layout, parts),
        disk,
        remote,
    )
    tree = RadixTree(layout.page_size, Residence.for_root)
    counters = CacheCounters()
    transfer_jobs = TransferJobs(pools.device, pools.host, disk, remote=remote)
    transfer_queue = TransferQueue(
        memory_executor or _default_memory_executor(device),
        disk_executor or _default_io_executor(transfer_jobs),
        clock,
    )
    residency = Residency(
        tree, pools, counters, config.namespace_share, sliding_window=sliding_window
    )
    if page_listener is not None:  # first of all: forget what an earlier process here held
        page_listener.all_cleared()
        residency.events = PageEvents(tree, page_listener)
    transfers = NodeTransfers(residency, transfer_jobs, transfer_queue, clock)
    index = RadixIndex(
        tree, fingerprint, config.enable_prefix_reuse, residency, sliding_window=sliding_window
    )
    write_through = config.write_policy is WritePolicy.WRITE_THROUGH
    demoter = Demoter(pools, residency, transfers, write_through)
    if isinstance(pools.device, SplitDevicePool) and sliding_window is not None:
        demoter.device_sliding = DeviceSliding(residency, pools.device, sliding_window)
    index.after_insert = demoter.path_inserted
    index.after_unlock = demoter.path_unlocked
    promoter = Promoter(residency, transfers, demoter, index, counters, clock)
    generations = _flush_generations(config, disk, remote)
    index.generation_of = generations.of
    if disk is not None:
        rebuild_from_disk(tree, disk, residency)
    budget, total = _pin_budgets(config)
    pins = PinRegistry(
        budget // layout.page_bytes,
        total // layout.page_bytes,
        config.disk_cache_dir if disk is not None else None,
    )
    return TieredCache(
        config,
        layout,
        tree=tree,
        pools=pools,
        counters=counters,
        transfer_jobs=transfer_jobs,
        transfer_queue=transfer_queue,
        residency=residency,
        transfers=transfers,
        index=index,
        demoter=demoter,
        promoter=promoter,
        pinning=Pinning(pins, index, residency, demoter, pools, config.host_enabled),
        retention=Retention(
            _retention_budget(config) // layout.page_bytes, index, residency, demoter, pools
        ),
        generations=generations,
    )


def _flush_generations(
    config: CacheConfig, disk: DiskStore | None, remote: RemoteTier | None
) -> FlushGenerations:
    """The flush generations: kept in the disk tier's directory, shared through the remote
    tier; read before the disk's records are matched or the first request arrives."""
    generations = FlushGenerations(config.disk_cache_dir if disk is not None else None)
    if remote is not None:
        SharedGenerations(remote.store, generations).start()
    return generations


def _device_pool(
    config: CacheConfig, layout: PageLayout, parts: PageParts | None, device: torch.device
) -> DevicePool:
    """For a model with sliding layers, a device pool that stores pages a layer at a time and
    frees their sliding part once nothing reads it (`SplitDevicePool`); whole pages with
    `--device-whole-pages` and for every other model."""
    if parts is None or not parts.has_sliding:
        return DevicePool.from_bytes(layout, config.device_cache_bytes, device)
    if config.device_whole_pages:
        capacity = config.device_cache_bytes
        return DevicePool.from_bytes(layout, capacity, device, parts.sliding_layers)
    return SplitDevicePool.from_bytes(parts, config.device_cache_bytes, device)


def _host_pool(config: CacheConfig, layout: PageLayout, parts: PageParts | None) -> HostPool:
    """For a model with sliding layers, a host pool that stores pages a layer at a time and
    keeps their sliding part only where a copy is given one (`SplitHostPool`); whole pages with
    `--host-whole-pages` and for every other model. A copy it writes down carries its gaps: the
    disk's records and the remote tier's values say which pages lack the sliding part."""
    whole = parts is None or not parts.has_sliding or config.host_whole_pages
    if whole or config.host_cache_bytes == 0:
        return HostPool.from_bytes(layout, config.host_cache_bytes)
    pinned = torch.cuda.is_available()
    return SplitHostPool.from_bytes(parts, config.host_cache_bytes, pinned)


def _pin_budgets(config: CacheConfig) -> tuple[int, int]:
    """`--pin-budget` (by default a quarter of the host tier) and `--pin-budget-total` (by
    default half the host tier, or `--pin-budget` when larger), in bytes."""
    budget = config.pin_budget_bytes
    if budget is None:
        budget = config.host_cache_bytes // 4
    total = config.pin_budget_total_bytes
    if total is None:
        total = max(config.host_cache_bytes // 2, budget)
    return budget, total


def _retention_budget(config: CacheConfig) -> int:
    """`--retention-budget`, by default a quarter of the lowest local tier below the device."""
    if config.retention_budget_bytes is not None:
        return config.retention_budget_bytes
    lowest = config.disk_cache_bytes if config.disk_enabled else config.host_cache_bytes
    return lowest // 4


def _open_disk(
    config: CacheConfig,
    layout: PageLayout,
    fingerprint: bytes,
    io: DiskIOBackend | None,
    parts: PageParts | None,
) -> DiskStore | SplitDiskStore | None:
    """For a model with sliding layers, a store whose records are a page's layers, its sliding
    layers written only where a copy is given them (`SplitDiskStore`); whole-page records with
    `--disk-whole-pages` (saying which pages lack their sliding layers) and for every other
    model."""
    if not config.disk_enabled:
        return None
    directory = config.disk_cache_dir
    assert directory is not None
    capacity = config.disk_cache_bytes
    if parts is None or not parts.has_sliding:
        return DiskStore(directory, fingerprint, layout, capacity, io=io)
    if config.disk_whole_pages:
        return DiskStore(directory, fingerprint, layout, capacity, io=io, parts=parts.describe())
    return SplitDiskStore(directory, fingerprint, parts, capacity, io=io)


def _open_remote(
    config: CacheConfig, layout: PageLayout, fingerprint: bytes, parts: PageParts | None
) -> RemoteTier | None:
    if not config.remote_enabled:
        return None
    assert config.remote_cache_url is not None
    if config.remote_secret is None:
        log.warning(
            "the remote tier has no secret: whoever can write to Redis can change answers "
            "and read which prompts were cached (--remote-secret-file)"
        )
    store = RemoteStore(
        config.remote_cache_url,
        fingerprint,
        layout.page_size,
        layout.page_bytes,
        config.remote_compression,
        config.remote_password,
        timeouts=RemoteTimeouts().scaled(config.remote_budget_scale),
        secret=config.remote_secret,
    )
    return RemoteTier(store, layout, parts=parts)


def _default_memory_executor(device: torch.device) -> TransferExecutor:
    if device.type == "cuda":
        return CudaStreamTransferExecutor(num_workers=2, device=device)
    return ThreadTransferExecutor(num_workers=2, name="tkv-copy")


def _default_io_executor(transfer_jobs: TransferJobs) -> ThreadTransferExecutor:
    """Four I/O workers. With a store below host they start now, each with its staging buffers
    faulted in (a store read lands in them on its way to the device): 4 x 96 MiB (three slots
    of 32 MiB) resident from the start. A first touch of fresh memory costs a page fault per
    4 KiB page, far slower than a copy into resident memory on a VM that hands freed memory
    back to its host; faulting the buffers in at start keeps that cost out of the first
    promotion from disk or Redis."""
    if not transfer_jobs.stores:
        return ThreadTransferExecutor(num_workers=IO_WORKERS, name="tkv-disk")
    staging, pages = transfer_jobs.staging, transfer_jobs.stage_pages
    return ThreadTransferExecutor(
        num_workers=IO_WORKERS, name="tkv-disk", warm=lambda: staging.prefault(pages)
    )

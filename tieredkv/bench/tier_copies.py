"""The transfer queue's own copy paths: TransferJobs jobs, exactly the callables Residency submits.

  host -> device   page by page (runs of consecutive pages at once) into the layer-major pool
  device -> host   page by page out of the layer-major pool into page-major host pages
  host -> disk     DiskStore.write_pages from the host pages in place, or through reused
                   aligned staging (double-buffered, 32 MiB chunks) when they are scattered
  disk -> host     DiskStore.read_pages into reused aligned staging (or in place), then out

One job per batch, run on the calling thread (a transfer worker runs the same callable). Page ids
are a seeded random permutation of each pool, as a pool's free list hands them out after a
while; the pools hold random bytes (faulted in), twice the largest batch, so no batch is served
from the CPU caches.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from tieredkv.bench.disk_check import drop_file
from tieredkv.bench.tier_limits import Rate, rep_seconds
from tieredkv.bench.tier_store import LAYOUT, REP_BYTES, make_records, span_gbps
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs


def make_transfer_jobs(num_pages: int, disk: DiskStore | None, seed: int) -> TransferJobs:
    """A TransferJobs over a CPU device pool and a host pool of `num_pages` random pages each."""
    device = DevicePool(LAYOUT, num_pages, "cpu")
    host = HostPool(LAYOUT, num_pages)
    generator = torch.Generator().manual_seed(seed)
    device.kv.view(torch.int16).random_(generator=generator)
    host.kv.view(torch.int16).random_(generator=generator)
    return TransferJobs(device, host, disk)


def _groups(num_pages: int, batch: int, rng: np.random.Generator) -> list[list[int]]:
    order = rng.permutation(num_pages).tolist()
    return [order[i : i + batch] for i in range(0, num_pages - batch + 1, batch)]


def _memory_copies_ok(transfer_jobs: TransferJobs, host: list[int], device: list[int]) -> bool:
    """Fresh bytes each way through the jobs arrive equal (page-major vs layer-major)."""
    host_kv, device_kv = transfer_jobs.host_pool.kv, transfer_jobs.device_pool.kv
    index = torch.tensor(device, dtype=torch.long)
    host_kv[host] = torch.rand((len(host), *LAYOUT.page_shape)).to(LAYOUT.dtype)
    transfer_jobs.job(Tier.HOST, Tier.DEVICE, host, device, [])()
    # (layers, 2, n, page_size, heads, dim) -> (n, layers, 2, page_size, heads, dim)
    arrived = device_kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5)
    ok = torch.equal(arrived, host_kv[host])
    device_kv.index_fill_(2, index, 1.5)
    transfer_jobs.job(Tier.DEVICE, Tier.HOST, device, host, [])()
    return ok and bool((host_kv[host] == 1.5).all())


def memory_gbps(
    transfer_jobs: TransferJobs, batch: int, reps: int, rng: np.random.Generator
) -> tuple[Rate, Rate, bool]:
    """(host->device, device->host) GB/s of one job per batch of `batch` pages, and whether
    the bytes arrived equal."""
    num_pages = transfer_jobs.host_pool.num_pages
    host_groups, device_groups = _groups(num_pages, batch, rng), _groups(num_pages, batch, rng)
    per_rep = max(REP_BYTES // (batch * LAYOUT.page_bytes), 1)

    def move(src: Tier, dst: Tier) -> Rate:
        cursor = itertools.count()

        def rep() -> None:
            for _ in range(per_rep):
                group = next(cursor) % len(host_groups)
                src_pages, dst_pages = (
                    (host_groups[group], device_groups[group])
                    if src is Tier.HOST
                    else (device_groups[group], host_groups[group])
                )
                transfer_jobs.job(src, dst, src_pages, dst_pages, [])()

        return Rate.of(per_rep * batch * LAYOUT.page_bytes, rep_seconds(rep, reps))

    to_device = move(Tier.HOST, Tier.DEVICE)
    to_host = move(Tier.DEVICE, Tier.HOST)
    return to_device, to_host, _memory_copies_ok(transfer_jobs, host_groups[0], device_groups[0])


def transfer_disk_gbps(
    transfer_jobs: TransferJobs, store: DiskStore, batch: int, reps: int, rng: np.random.Generator
) -> tuple[Rate, Rate, bool]:
    """(host->disk, disk->host) GB/s of one job per batch of `batch` pages walking through the
    whole store, and whether every page read back verified and equal to the host pages."""
    host_kv = transfer_jobs.host_pool.kv
    host_pages = rng.permutation(transfer_jobs.host_pool.num_pages)[:batch].tolist()
    expected = host_kv[host_pages].clone()  # (batch, *page_shape)
    num_groups = store.num_pages // batch
    slots = store.alloc(num_groups * batch)
    records = make_records(batch)
    verified: list[bool] = []

    def write(group: int) -> None:
        group_slots = slots[group * batch : (group + 1) * batch]
        transfer_jobs.job(Tier.HOST, Tier.DISK, host_pages, group_slots, records)()

    def read(group: int) -> None:
        group_slots = slots[group * batch : (group + 1) * batch]
        verified.extend(transfer_jobs.job(Tier.DISK, Tier.HOST, group_slots, host_pages, records)())

    def before_read() -> None:
        host_kv[host_pages] = 0  # what arrives must come from the disk
        drop_file(store.directory / STORE_FILE)

    try:
        write_gbps, read_gbps = span_gbps(num_groups, batch, reps, write, read, before_read)
    finally:
        store.free(slots)
    ok = bool(verified) and all(verified)
    arrived = host_kv[host_pages].view(torch.int16)  # random bits: bf16 NaNs compare unequal
    return write_gbps, read_gbps, ok and torch.equal(arrived, expected.view(torch.int16))

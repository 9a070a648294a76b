"""`tieredkv bench tiers --breakdown`: where a PageCopier job's time goes, stage by stage, beside
cheaper ways to move the same pages (measured in the same run, same pages, same pools).

Stages of today's jobs (page_copier.py):
  staging     torch.empty + index_select of the host pages (a fresh allocation per job: page
              faults) vs the same index_select into a reused, already-faulted buffer
  scatter     kernels.scatter_pages (index_copy_ of the permuted staging into the device pool)
  gather      kernels.gather_pages (index_select + permute + contiguous: two copies)
  host write  host.index_copy_ of a staging tensor into the host pages
  disk        write_pages / read_pages from an aligned reused buffer (no bounce copy) vs a
              fresh torch.empty (unaligned: the store's bounce copy, plus page faults)
Alternatives: one numpy copy per page between the two pools (no staging at all).
"""

from __future__ import annotations

import numpy as np
import torch

from tieredkv.bench.tier_limits import drop_cache, median_seconds
from tieredkv.bench.tier_store import LAYOUT, aligned_pages, make_records
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.page_copier import PageCopier


def _pool_views(copier: PageCopier) -> tuple[np.ndarray, np.ndarray]:
    """int16 numpy views: device (layers * 2, pages, run), host (pages, layers * 2, run)."""
    slabs = LAYOUT.num_layers * 2
    device = copier.device_pool.kv.view(torch.int16).numpy()
    host = copier.host_pool.kv.view(torch.int16).numpy()
    return device.reshape(slabs, device.shape[2], -1), host.reshape(host.shape[0], slabs, -1)


def breakdown(
    copier: PageCopier, store: DiskStore | None, batch: int, reps: int, rng: np.random.Generator
) -> dict[str, float]:
    """GB/s of each stage and alternative for one batch of `batch` pages (see module doc);
    without a `store`, the memory stages only."""
    num_pages = copier.host_pool.num_pages
    host_pages = rng.permutation(num_pages)[:batch].tolist()
    device_pages = rng.permutation(num_pages)[:batch].tolist()
    host_index, device_index = torch.tensor(host_pages), torch.tensor(device_pages)
    host_kv, device_kv = copier.host_pool.kv, copier.device_pool.kv
    kernels = copier.kernels
    shape = (batch, *LAYOUT.page_shape)
    reused = torch.empty(shape, dtype=LAYOUT.dtype)
    reused.fill_(0)
    device_np, host_np = _pool_views(copier)

    def per_page(to_device: bool) -> None:
        for host_page, device_page in zip(host_pages, device_pages, strict=True):
            if to_device:
                np.copyto(device_np[:, device_page], host_np[host_page])
            else:
                np.copyto(host_np[host_page], device_np[:, device_page])

    stages = {
        "job host->device": lambda: copier.job(
            Tier.HOST, Tier.DEVICE, host_pages, device_pages, []
        )(),
        "job device->host": lambda: copier.job(
            Tier.DEVICE, Tier.HOST, device_pages, host_pages, []
        )(),
        "staging: index_select into torch.empty": lambda: torch.index_select(
            host_kv, 0, host_index, out=torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "staging: index_select into a reused buffer": lambda: torch.index_select(
            host_kv, 0, host_index, out=reused
        ),
        "scatter_pages (into the device pool)": lambda: kernels.scatter_pages(
            device_kv, device_index, reused
        ),
        "gather_pages (from the device pool)": lambda: kernels.gather_pages(
            device_kv, device_index
        ),
        "host index_copy_ of staging": lambda: host_kv.index_copy_(0, host_index, reused),
        "alt: numpy copy per page host->device": lambda: per_page(True),
        "alt: numpy copy per page device->host": lambda: per_page(False),
    }
    result = {name: median_seconds(run, reps) for name, run in stages.items()}
    if store is not None:
        result |= _disk_stages(copier, store, host_pages, reps)
    return {name: batch * LAYOUT.page_bytes / seconds / 1e9 for name, seconds in result.items()}


def _disk_stages(
    copier: PageCopier, store: DiskStore, host_pages: list[int], reps: int
) -> dict[str, float]:
    """Seconds of each disk stage for the host pages `host_pages`."""
    batch = len(host_pages)
    shape = (batch, *LAYOUT.page_shape)
    aligned = aligned_pages(batch)
    slots = store.alloc(batch)
    records = make_records(batch)
    forget = lambda: drop_cache(store.directory / STORE_FILE)  # noqa: E731
    stages = {
        "job host->disk": lambda: copier.job(Tier.HOST, Tier.DISK, host_pages, slots, records)(),
        "write_pages from torch.empty": lambda: store.write_pages(
            slots, records, torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "write_pages from an aligned reused buffer": lambda: store.write_pages(
            slots, records, aligned
        ),
    }
    result = {name: median_seconds(run, reps) for name, run in stages.items()}
    reads = {
        "job disk->host": lambda: copier.job(Tier.DISK, Tier.HOST, slots, host_pages, records)(),
        "read_pages into torch.empty": lambda: store.read_pages(
            slots, records, torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "read_pages into an aligned reused buffer": lambda: store.read_pages(
            slots, records, aligned
        ),
    }
    result |= {name: median_seconds(run, reps, forget) for name, run in reads.items()}
    store.free(slots)
    return result

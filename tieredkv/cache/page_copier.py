"""Copy jobs: the bytes of a transfer between two tiers, run on a mover thread.

A job touches only the pages it was given (the engine thread pinned them) and returns, per page,
whether it arrived intact (a disk record that fails verification is False, never served).

  from    to      how
  device  host    gather (layer-major -> page-major) into the host pages
  host    device  index_select the host pages, scatter into the device pages
  *       disk    one page-major payload, `DiskStore.write_pages`
  disk    *       `DiskStore.read_pages` into a bounce buffer (no host page needed), then copy
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tieredkv.cache.device_pool import DevicePool
from tieredkv.cache.executor import CopyJob
from tieredkv.cache.host_pool import HostPool
from tieredkv.cache.tier import Tier
from tieredkv.kernels.backend import select_backend

if TYPE_CHECKING:
    from tieredkv.cache.disk_store import DiskRecord, DiskStore


def _index(pages: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(pages, dtype=torch.long, device=device)


class PageCopier:
    """Builds copy jobs over the three pools. The pools' tensors are shared with the engine;
    a job reads and writes only its own pages."""

    def __init__(self, device_pool: DevicePool, host_pool: HostPool, disk: DiskStore | None):
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.disk = disk
        self.kernels = select_backend(device_pool.device)  # gather/scatter: Triton on CUDA

    def job(
        self,
        src_tier: Tier,
        dst_tier: Tier,
        src_pages: list[int],
        dst_pages: list[int],
        records: list[DiskRecord],
    ) -> CopyJob:
        """A job copying `src_pages` of `src_tier` to `dst_pages` of `dst_tier`.

        `records` name the pages (disk writes store them, disk reads verify against them)."""
        src, dst, recs = list(src_pages), list(dst_pages), list(records)
        return lambda: self._copy(src_tier, dst_tier, src, dst, recs)

    def _copy(
        self,
        src_tier: Tier,
        dst_tier: Tier,
        src: list[int],
        dst: list[int],
        records: list[DiskRecord],
    ) -> list[bool]:
        page_ok = [True] * len(src)
        if src_tier is Tier.DISK:
            staged, page_ok = self._read_disk(src, records)
        else:
            staged = self._read_memory(src_tier, src)
        self._write(dst_tier, dst, staged, records)
        return page_ok

    def _read_memory(self, tier: Tier, pages: list[int]) -> torch.Tensor:
        if tier is Tier.DEVICE:
            kv = self.device_pool.kv
            return self.kernels.gather_pages(kv, _index(pages, kv.device))  # (n, *page_shape)
        kv = self.host_pool.kv
        # pinned staging, so that a copy on to the device is asynchronous
        out = torch.empty((len(pages), *kv.shape[1:]), dtype=kv.dtype, pin_memory=kv.is_pinned())
        return torch.index_select(kv, 0, _index(pages, kv.device), out=out)

    def _read_disk(
        self, slots: list[int], records: list[DiskRecord]
    ) -> tuple[torch.Tensor, list[bool]]:
        assert self.disk is not None
        layout = self.device_pool.layout
        pin = self.host_pool.pinned
        bounce = torch.empty((len(slots), *layout.page_shape), dtype=layout.dtype, pin_memory=pin)
        page_ok = self.disk.read_pages(slots, list(records), bounce)
        return bounce, page_ok

    def _write(
        self, tier: Tier, pages: list[int], staged: torch.Tensor, records: list[DiskRecord]
    ) -> None:
        if tier is Tier.DEVICE:
            kv = self.device_pool.kv
            staged = staged.to(kv.device, non_blocking=True)
            self.kernels.scatter_pages(kv, _index(pages, kv.device), staged)
        elif tier is Tier.HOST:
            kv = self.host_pool.kv
            kv.index_copy_(0, _index(pages, kv.device), staged.to(kv.device))
        else:
            assert self.disk is not None
            self.disk.write_pages(pages, records, staged.cpu().contiguous())

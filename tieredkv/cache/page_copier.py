"""Copy jobs: the bytes of a transfer between two tiers, run on a mover thread.

A job touches only the pages it was given (the engine thread pinned them) and returns, per page,
whether it arrived intact (a disk record that fails verification is False, never served).

  from    to      CPU device pool                    CUDA device pool
  host    device  page by page, no staging           pinned staging -> device staging, scatter
  device  host    page by page, no staging           gather -> pinned staging -> host pages
  *       disk    host run in place, else staging    (device: gather -> pinned staging)
  disk    *       host run in place, else staging    (device: staging -> device, scatter)

Staging is reused (per worker thread, see page_staging) and bounded: a staged transfer moves
STAGE_BYTES at a time. A disk transfer whose host pages are consecutive reads or writes them
in place (the host pool is page-aligned, so O_DIRECT needs no bounce copy either).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tieredkv.cache.device_pool import DevicePool
from tieredkv.cache.executor import CopyJob
from tieredkv.cache.host_pool import HostPool
from tieredkv.cache.page_rows import PageRows, copy_pages, paired_runs
from tieredkv.cache.page_staging import StagingBuffers
from tieredkv.cache.tier import Tier
from tieredkv.kernels.backend import select_backend

if TYPE_CHECKING:
    from tieredkv.cache.disk_store import DiskRecord, DiskStore

STAGE_BYTES = 32 << 20  # staging per worker thread, at most


def _index(pages: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(pages, dtype=torch.long, device=device)


def _one_run(pages: list[int]) -> bool:
    return len(paired_runs(pages, pages)) == 1


class PageCopier:
    """Builds copy jobs over the three pools. The pools' tensors are shared with the engine;
    a job reads and writes only its own pages. Jobs may run on any number of threads at once.

    `staged=True` forces the CUDA data path (staging buffers, gather/scatter kernels) on a CPU
    device pool too, so tests cover it on a machine without a GPU."""

    def __init__(
        self,
        device_pool: DevicePool,
        host_pool: HostPool,
        disk: DiskStore | None,
        staged: bool | None = None,
    ) -> None:
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.disk = disk
        self.kernels = select_backend(device_pool.device)  # gather/scatter: Triton on CUDA
        self.staged = device_pool.device.type != "cpu" if staged is None else staged
        layout = device_pool.layout
        self.staging = StagingBuffers(layout, host_pool.pinned, device_pool.device)
        self.stage_pages = max(STAGE_BYTES // layout.page_bytes, 1)
        self._host_rows = PageRows.page_major(host_pool.kv)
        # the device pool seen page by page: only where it lives in CPU memory
        self._device_rows = None if self.staged else PageRows.layer_major(device_pool.kv)

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
        assert len(src) == len(dst), f"{len(src)} source pages vs {len(dst)} destination pages"
        if self._device_rows is not None and Tier.DISK not in (src_tier, dst_tier):
            copy_pages(self._rows(dst_tier), dst, self._rows(src_tier), src)
            return [True] * len(src)
        page_ok: list[bool] = []
        for start in range(0, len(src), self.stage_pages):
            end = start + self.stage_pages
            src_chunk, dst_chunk = src[start:end], dst[start:end]
            if src_tier is Tier.DISK:
                page_ok += self._from_disk(src_chunk, records[start:end], dst_tier, dst_chunk)
                continue
            if dst_tier is Tier.DISK:
                self._to_disk(src_tier, src_chunk, dst_chunk, records[start:end])
            else:
                self._write(dst_tier, dst_chunk, self._read(src_tier, src_chunk))
            page_ok += [True] * len(src_chunk)
        return page_ok

    def _rows(self, tier: Tier) -> PageRows:
        assert tier is not Tier.DISK
        if tier is Tier.HOST:
            return self._host_rows
        assert self._device_rows is not None, "page-by-page device access needs a CPU pool"
        return self._device_rows

    def _read(self, tier: Tier, pages: list[int]) -> torch.Tensor:
        """The pages in this thread's CPU staging, (n, *page_shape)."""
        staging = self.staging.host(len(pages))
        if tier is Tier.HOST or self._device_rows is not None:
            copy_pages(
                PageRows.page_major(staging), list(range(len(pages))), self._rows(tier), pages
            )
            return staging
        kv = self.device_pool.kv
        gathered = self.staging.device_buffer(len(pages))  # (n, *page_shape) on the device
        self.kernels.gather_pages(kv, _index(pages, kv.device), out=gathered)
        staging.copy_(gathered)  # synchronous: the staging is complete on return
        return staging

    def _write(self, tier: Tier, pages: list[int], staging: torch.Tensor) -> None:
        """Copy this thread's CPU staging (n, *page_shape) into the pages of `tier`."""
        if tier is Tier.HOST or self._device_rows is not None:
            copy_pages(
                self._rows(tier), pages, PageRows.page_major(staging), list(range(len(pages)))
            )
            return
        kv = self.device_pool.kv
        arrived = self.staging.device_buffer(len(pages))
        arrived.copy_(staging, non_blocking=True)
        self.staging.fence()  # the next job on this thread waits before reusing the staging
        self.kernels.scatter_pages(kv, _index(pages, kv.device), arrived)

    def _to_disk(
        self, tier: Tier, pages: list[int], slots: list[int], records: list[DiskRecord]
    ) -> None:
        assert self.disk is not None
        if tier is Tier.HOST and _one_run(pages):  # in place: no staging at all
            payload = self.host_pool.kv[pages[0] : pages[0] + len(pages)]
        else:
            payload = self._read(tier, pages)
        self.disk.write_pages(slots, records, payload)

    def _from_disk(
        self, slots: list[int], records: list[DiskRecord], tier: Tier, pages: list[int]
    ) -> list[bool]:
        assert self.disk is not None
        if tier is Tier.HOST and _one_run(pages):  # in place: no staging at all
            out = self.host_pool.kv[pages[0] : pages[0] + len(pages)]
            return self.disk.read_pages(slots, list(records), out)
        staging = self.staging.host(len(pages))
        page_ok = self.disk.read_pages(slots, list(records), staging)
        self._write(tier, pages, staging)
        return page_ok

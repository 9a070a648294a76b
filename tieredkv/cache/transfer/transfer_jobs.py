"""Copy jobs: the bytes of a transfer between two tiers, run on a transfer thread.

A job touches only the pages it was given (the engine thread pinned them) and returns, per page,
whether it arrived intact (a disk record that fails verification is False, never served).

  from    to      CPU device pool                    CUDA device pool
  host    device  page by page, no staging (*)       pinned staging -> device staging, scatter
  device  host    page by page, no staging (*)       gather -> pinned staging -> host pages
  *       disk    host run in place, else staging    (device: gather -> pinned staging)
  disk    *       host run in place, else staging    (device: staging -> device, scatter)
  remote  as disk, except into a CPU pool: each page goes from the fetch into its page
          (the remote tier's `read_pages_into`), no staging

(*) A job of `SPLIT_MIN_PAGES` pages or more shares its pages with one helper thread: one
thread alone cannot reach memcpy speed on these strided copies (see `layout_copy`).

Staging is reused (per worker thread, see page_staging) and bounded: a staged transfer moves
at most STAGE_BYTES at a time, double-buffered. A store transfer overlaps its staging copies
with its I/O: while a helper thread writes one chunk, the job stages the next. A disk read into
CPU pools has three chunks in flight, each copied out piece by piece on its reading thread as the
store verifies it; a remote read (or one into a CUDA pool) has one, the job unstaging the
previous chunk meanwhile. A chunk whose host pages are consecutive moves in place, without
staging (the host pool is page-aligned, so O_DIRECT needs no bounce copy either).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import torch

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.executors import TransferJob
from tieredkv.cache.transfer.layout_copy import PageRows, copy_pages, copy_threads, paired_runs
from tieredkv.cache.transfer.page_staging import HOST_SLOTS, StagingBuffers
from tieredkv.cache.transfer.split_rows import SplitPageRows
from tieredkv.kernels.backend import select_backend

if TYPE_CHECKING:
    from tieredkv.cache.disk.split_store import SplitDiskStore
    from tieredkv.cache.disk.store import DiskStore, PagesVerified
    from tieredkv.cache.page_record import PageRecord
    from tieredkv.cache.remote.remote_tier import RemoteTier

STAGE_BYTES = 32 << 20  # per staging buffer, two per worker thread: the store's own chunk size
# Threads that run the store calls of disk jobs and the helper half of host<->device copies,
# shared by all transfer jobs (neither a store call nor a copy part ever waits on this pool, so
# sharing cannot deadlock).
HELPER_THREADS = 8
HELPER_THREAD_PREFIX = "tkv-stage"
LANDING_BATCH_PAGES = 16  # a remote read tells `device_landing_listeners` this many at a time
# A streamed disk read into a CPU pool keeps this many chunks in flight (one staging slot each):
# with two, chunk k + 2 could start only once chunk k was copied out, and the disk would sit
# idle meanwhile
STREAMED_CHUNKS_IN_FLIGHT = HOST_SLOTS


def _index(pages: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(pages, dtype=torch.long, device=device)


def _one_run(pages: list[int]) -> bool:
    return len(paired_runs(pages, pages)) == 1


def _settle(pending: Future | None) -> None:
    if pending is not None:
        wait([pending])  # SYNC: no store call outlives its job (nor uses staging after it)


class TransferJobs:
    """Builds copy jobs over the three pools. The pools' tensors are shared with the engine;
    a job reads and writes only its own pages. Jobs may run on any number of threads at once.

    `staged=True` forces the CUDA data path (staging buffers, gather/scatter kernels) on a CPU
    device pool too, so tests cover it on a machine without a GPU.

    `TransferJobs` owns its helper threads (started on demand): `close()` them once no job runs
    any more, after the transfer queue that runs the jobs has closed."""

    def __init__(
        self,
        device_pool: DevicePool,
        host_pool: HostPool,
        disk: DiskStore | SplitDiskStore | None,
        staged: bool | None = None,
        remote: RemoteTier | None = None,
    ) -> None:
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.disk = disk
        self.stores: dict[Tier, DiskStore | SplitDiskStore | RemoteTier] = {
            tier: store for tier, store in ((Tier.DISK, disk), (Tier.REMOTE, remote)) if store
        }
        self.kernels = select_backend(device_pool.device)  # gather/scatter: Triton on CUDA
        self.staged = device_pool.device.type != "cpu" if staged is None else staged
        layout = device_pool.layout
        self.staging = StagingBuffers(layout, host_pool.pinned, device_pool.device)
        self.stage_pages = max(STAGE_BYTES // layout.page_bytes, 1)
        split = isinstance(host_pool, SplitHostPool)
        self._host_rows = SplitPageRows(host_pool) if split else PageRows.page_major(host_pool.kv)
        self._host_in_place = not split  # a split pool's pages are not one run of bytes
        # the device pool seen page by page: only where it lives in CPU memory
        self._device_rows: PageRows | None = None
        if not self.staged:
            self._device_rows = (
                SplitPageRows(device_pool)
                if isinstance(device_pool, SplitDevicePool)
                else PageRows.layer_major(device_pool.kv)
            )
        self._helpers = ThreadPoolExecutor(HELPER_THREADS, thread_name_prefix=HELPER_THREAD_PREFIX)
        self._copy_helper = None if self.staged else self._helpers
        # called with device pages whose verified KV a store read just put in the pool (on
        # the reading thread): lets a promoted sequence's workspace fill while reads go on
        self.device_landing_listeners: list[Callable[[list[int]], None]] = []

    def memory_copy_threads(self, num_pages: int) -> int:
        """How many threads a host<->device job of `num_pages` pages copies on."""
        return copy_threads(num_pages, self._copy_helper)

    def close(self) -> None:
        """Stop the helper threads (idle once every job has returned)."""
        self._helpers.shutdown(wait=True)

    def job(
        self,
        src_tier: Tier,
        dst_tier: Tier,
        src_pages: list[int],
        dst_pages: list[int],
        records: list[PageRecord],
    ) -> TransferJob:
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
        records: list[PageRecord],
    ) -> list[bool]:
        assert len(src) == len(dst), f"{len(src)} source pages vs {len(dst)} destination pages"
        if self._device_rows is not None and not (src_tier.is_store or dst_tier.is_store):
            copy_pages(self._rows(dst_tier), dst, self._rows(src_tier), src, self._copy_helper)
            return [True] * len(src)
        if src_tier.is_store:
            return self._from_store(self.stores[src_tier], src, records, dst_tier, dst)
        if dst_tier.is_store:
            self._to_store(src_tier, src, self.stores[dst_tier], dst, records)
        else:
            for index, (start, end) in enumerate(self._chunks(len(src))):
                slot = index % 2
                self._write(
                    dst_tier, dst[start:end], self._read(src_tier, src[start:end], slot), slot
                )
        return [True] * len(src)

    def _chunks(self, count: int) -> list[tuple[int, int]]:
        """(start, end) of about equal chunks of at most `stage_pages` pages."""
        step = -(-count // -(-count // self.stage_pages)) if count else 1
        return [(start, min(start + step, count)) for start in range(0, count, step)]

    def _rows(self, tier: Tier) -> PageRows:
        assert not tier.is_store
        if tier is Tier.HOST:
            return self._host_rows
        assert self._device_rows is not None, "page-by-page device access needs a CPU pool"
        return self._device_rows

    def _read(self, tier: Tier, pages: list[int], slot: int) -> torch.Tensor:
        """The pages in this thread's CPU staging `slot`, (n, *page_shape)."""
        staging = self.staging.host(len(pages), slot)
        if tier is Tier.HOST or self._device_rows is not None:
            copy_pages(
                PageRows.page_major(staging), list(range(len(pages))), self._rows(tier), pages
            )
            return staging
        gathered = self.staging.device_buffer(len(pages))  # (n, *page_shape) on the device
        if isinstance(self.device_pool, SplitDevicePool):
            self.device_pool.gather_pages(pages, gathered)
        else:
            kv = self.device_pool.kv
            self.kernels.gather_pages(kv, _index(pages, kv.device), out=gathered)
        staging.copy_(gathered)  # synchronous: the staging is complete on return
        return staging

    def _write(self, tier: Tier, pages: list[int], staging: torch.Tensor, slot: int) -> None:
        """Copy this thread's CPU staging `slot` (n, *page_shape) into the pages of `tier`."""
        if tier is Tier.HOST or self._device_rows is not None:
            copy_pages(
                self._rows(tier), pages, PageRows.page_major(staging), list(range(len(pages)))
            )
            return
        arrived = self.staging.device_buffer(len(pages))
        arrived.copy_(staging, non_blocking=True)
        self.staging.fence(slot)  # the staging's next user waits for this copy
        if isinstance(self.device_pool, SplitDevicePool):
            self.device_pool.scatter_pages(pages, arrived)
        else:
            kv = self.device_pool.kv
            self.kernels.scatter_pages(kv, _index(pages, kv.device), arrived)

    def _in_place(self, tier: Tier, pages: list[int]) -> torch.Tensor | None:
        """The host pages themselves, (n, *page_shape), when they are one consecutive run."""
        if tier is Tier.HOST and self._host_in_place and _one_run(pages):
            return self.host_pool.kv[pages[0] : pages[0] + len(pages)]
        return None

    def _to_store(
        self,
        tier: Tier,
        pages: list[int],
        store: DiskStore | SplitDiskStore | RemoteTier,
        slots: list[int],
        records: list[PageRecord],
    ) -> None:
        """Chunk k is staged while chunk k - 1 is written (staging slot k % 2)."""
        pending: Future | None = None
        try:
            for index, (start, end) in enumerate(self._chunks(len(pages))):
                payload = self._in_place(tier, pages[start:end])
                if payload is None:
                    payload = self._read(tier, pages[start:end], index % 2)
                if pending is not None:
                    pending.result()  # SYNC: chunk k - 1 written; its slot is free again
                pending = self._helpers.submit(
                    store.write_pages, slots[start:end], records[start:end], payload
                )
            if pending is not None:
                pending.result()  # SYNC: the last chunk written
        finally:
            _settle(pending)

    def _from_store(
        self,
        store: DiskStore | SplitDiskStore | RemoteTier,
        slots: list[int],
        records: list[PageRecord],
        tier: Tier,
        pages: list[int],
    ) -> list[bool]:
        """Chunks are read on helper threads into staging slots k % 2 (or in place).

        From the disk into CPU pools, STREAMED_CHUNKS_IN_FLIGHT chunks are read at once, so
        the store always has the next chunk to read, and a staged chunk is copied out piece by
        piece on its reading thread as the store verifies it, overlapping the reads still in
        flight; chunk k + 3 starts once chunk k is out. From the remote store into CPU pools,
        one fetch hands each page to be copied into its page. Otherwise (into a CUDA pool)
        chunk k + 1 is read while this thread copies chunk k out."""
        into_cpu_pool = tier is Tier.HOST or self._device_rows is not None
        if into_cpu_pool and getattr(store, "hands_pages_on", False):
            rows = self._rows(tier)
            landed: list[int] = []  # told in batches: a listener's call costs per call

            def put(index: int, data) -> None:
                rows.put(pages[index], data)
                landed.append(pages[index])
                if len(landed) >= LANDING_BATCH_PAGES:
                    self._landed(tier, landed[:])
                    landed.clear()

            page_ok = store.read_pages_into(slots, records, put)  # type: ignore[union-attr]
            self._landed(tier, landed)
            return page_ok
        chunks = self._chunks(len(pages))
        streamed = store.streams_reads and into_cpu_pool
        in_flight = STREAMED_CHUNKS_IN_FLIGHT if streamed else 1
        # staging slots: one per chunk in flight, else this thread unstages one while one is read
        num_staging = in_flight if streamed else 2

        def submit(index: int) -> tuple[Future, torch.Tensor | None]:
            """Start chunk `index`'s read; returns it and the staging this thread unstages."""
            start, end = chunks[index]
            out = self._in_place(tier, pages[start:end])
            to_unstage = None
            copy_out: tuple[PagesVerified, ...] = ()  # the store's `on_verified`, if streamed
            if out is None:
                out = self.staging.host(end - start, index % num_staging)
                if streamed:
                    copy_out = (self._copy_out(tier, pages[start:end], out),)
                else:
                    to_unstage = out
            future = self._helpers.submit(
                store.read_pages, slots[start:end], records[start:end], out, *copy_out
            )
            return future, to_unstage

        page_ok: list[bool] = []
        pending: deque[tuple[Future, torch.Tensor | None]] = deque()
        try:
            for index in range(min(in_flight, len(chunks))):
                pending.append(submit(index))
            for index, (start, end) in enumerate(chunks):
                future, to_unstage = pending.popleft()
                page_ok += future.result()  # SYNC: chunk k read (and, streamed, copied out)
                if index + in_flight < len(chunks):
                    pending.append(submit(index + in_flight))  # its slot is free
                if to_unstage is not None:
                    self._write(tier, pages[start:end], to_unstage, index % num_staging)
        finally:
            for future, _ in pending:
                _settle(future)
        return page_ok

    def _copy_out(self, tier: Tier, pages: list[int], staging: torch.Tensor) -> PagesVerified:
        """A store's `on_verified` callback: copy the verified pages of `staging` (CPU) into
        `pages` of `tier` (a CPU pool) as they are handed on."""
        staged = PageRows.page_major(staging)
        rows = self._rows(tier)

        def copy(start: int, end: int, flags: list[bool]) -> None:
            verified = [index for index, ok in zip(range(start, end), flags, strict=True) if ok]
            copy_pages(rows, [pages[index] for index in verified], staged, verified)
            self._landed(tier, [pages[index] for index in verified])

        return copy

    def _landed(self, tier: Tier, pages: list[int]) -> None:
        if tier is Tier.DEVICE and pages:
            for listener in self.device_landing_listeners:
                listener(pages)

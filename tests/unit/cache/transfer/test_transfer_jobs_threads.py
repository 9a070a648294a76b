"""Copy jobs on the thread executor at once, per-thread staging, runs, the aligned host pool."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.unit.cache.disk.disk_cases import chain, open_store
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.executors import ThreadTransferExecutor
from tieredkv.cache.transfer.layout_copy import paired_runs
from tieredkv.cache.transfer.page_staging import HOST_SLOTS, StagingBuffers
from tieredkv.cache.transfer.transfer_jobs import TransferJobs

# 4 KiB pages, bf16
LAYOUT = PageLayout(num_layers=2, num_kv_heads=2, head_dim=64, page_size=4, dtype=torch.bfloat16)
NUM_PAGES = 48


def _random(tensor: torch.Tensor, seed: int) -> None:
    tensor.view(torch.int16).random_(generator=torch.Generator().manual_seed(seed))


def _device_page(transfer_jobs: TransferJobs, page: int) -> torch.Tensor:
    return transfer_jobs.device_pool.kv[:, :, page].contiguous().view(torch.int16)


def _host_page(transfer_jobs: TransferJobs, page: int) -> torch.Tensor:
    return transfer_jobs.host_pool.kv[page].view(torch.int16)


@pytest.mark.parametrize("staged", [False, True])
def test_concurrent_jobs_on_the_thread_executor_each_move_their_own_pages(
    tmp_path: Path, staged: bool
) -> None:
    store = open_store(tmp_path, layout=LAYOUT, capacity=1 << 20)
    device, host = DevicePool(LAYOUT, NUM_PAGES, "cpu"), HostPool(LAYOUT, NUM_PAGES)
    _random(device.kv, 1)
    _random(host.kv, 2)
    transfer_jobs = TransferJobs(device, host, store, staged=staged)
    transfer_jobs.stage_pages = 2  # several staging refills per job
    rng = random.Random(3)
    host_order, device_order = rng.sample(range(NUM_PAGES), 48), rng.sample(range(NUM_PAGES), 48)
    # 12 jobs of 4 pages on disjoint pages: 4 host->device, 4 device->host, 4 host->disk
    jobs = []
    device_want: dict[int, torch.Tensor] = {}  # device page -> the bytes it must end with
    host_want: dict[int, torch.Tensor] = {}
    disk_want: list[tuple[list[int], list[int]]] = []  # (slots, host pages written there)
    slots = store.alloc(16)
    records = chain(4, layout=LAYOUT)
    for index in range(12):
        hosts = host_order[4 * index : 4 * index + 4]
        devices = device_order[4 * index : 4 * index + 4]
        if index < 4:
            jobs.append(transfer_jobs.job(Tier.HOST, Tier.DEVICE, hosts, devices, []))
            for h, d in zip(hosts, devices, strict=True):
                device_want[d] = _host_page(transfer_jobs, h).clone()
        elif index < 8:
            jobs.append(transfer_jobs.job(Tier.DEVICE, Tier.HOST, devices, hosts, []))
            for h, d in zip(hosts, devices, strict=True):
                host_want[h] = _device_page(transfer_jobs, d).clone()
        else:
            group = slots[4 * (index - 8) : 4 * (index - 7)]
            jobs.append(transfer_jobs.job(Tier.HOST, Tier.DISK, hosts, group, records))
            disk_want.append((group, hosts))
    outcomes: list[list[bool] | None] = []
    done = threading.Event()

    def report(page_ok: list[bool] | None, error: object) -> None:
        assert error is None, error
        outcomes.append(page_ok)
        if len(outcomes) == len(jobs):
            done.set()

    executor = ThreadTransferExecutor(num_workers=4, name="test-copy")
    for index, job in enumerate(jobs):
        executor.submit(index, job, report)
    executor.shutdown()
    assert done.is_set() and outcomes == [[True] * 4] * 12
    for page, want in device_want.items():
        assert torch.equal(_device_page(transfer_jobs, page), want)
    for page, want in host_want.items():
        assert torch.equal(_host_page(transfer_jobs, page), want)
    for group, hosts in disk_want:  # the records read back equal to the pages written
        back = torch.empty((4, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
        assert store.read_pages(group, records, back) == [True] * 4
        assert torch.equal(back.view(torch.int16), host.kv[hosts].view(torch.int16))
    store.close()


def test_staging_is_reused_per_thread_and_never_shared() -> None:
    staging = StagingBuffers(LAYOUT, pinned=False, device=torch.device("cpu"))
    first = staging.host(4)
    assert staging.host(3).data_ptr() == first.data_ptr()  # reused on this thread
    slots = {staging.host(4, slot=slot).data_ptr() for slot in range(HOST_SLOTS)}
    assert len(slots) == HOST_SLOTS == 3  # double buffering, and a third streamed chunk
    with pytest.raises(AssertionError):
        staging.host(4, slot=HOST_SLOTS)
    assert first.data_ptr() % 4096 == 0 and tuple(first.shape) == (4, *LAYOUT.page_shape)
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(staging.host(4).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != first.data_ptr()
    assert staging.host(9).shape[0] == 9  # grows when a job needs more


def test_paired_runs_split_where_either_side_breaks() -> None:
    assert paired_runs([3, 4, 5, 9, 10], [0, 1, 2, 7, 6]) == [(3, 0, 3), (9, 7, 1), (10, 6, 1)]
    assert paired_runs([], []) == []
    assert paired_runs([5], [2]) == [(5, 2, 1)]


def test_host_pool_is_page_aligned_and_zeroed() -> None:
    pool = HostPool(LAYOUT, 5)
    assert pool.kv.data_ptr() % 4096 == 0 and pool.kv.is_contiguous()
    assert not pool.kv.view(torch.int16).any()
    pool.kv[4] = 1.0
    assert bool((pool.kv[4] == 1.0).all()) and not pool.kv[3].view(torch.int16).any()


class _SlowStore:
    """Stands in for a DiskStore: each call takes a while (the job stages the next chunk
    meanwhile) and call number `fail_at` raises."""

    def __init__(self, fail_at: int = 0, streams_reads: bool = True) -> None:
        self.fail_at = fail_at
        self.streams_reads = streams_reads  # the disk store's reads do, the remote tier's not
        self.calls = 0
        self.running = 0

    def _call(self, on_verified: Callable[..., None] | None = None) -> list[bool]:
        self.calls += 1
        self.running += 1
        try:
            if self.calls == self.fail_at:
                raise OSError("injected disk failure")
            threading.Event().wait(0.05)
            if on_verified is not None:  # the pages are handed on as a real store does
                on_verified(0, 2, [True] * 2)
            return [True] * 2
        finally:
            self.running -= 1

    def write_pages(self, slots: list[int], records: list, payload: torch.Tensor) -> None:
        self._call()

    def read_pages(
        self,
        slots: list[int],
        records: list,
        out: torch.Tensor,
        on_verified: Callable[..., None] | None = None,
    ) -> list[bool]:
        return self._call(on_verified)


def _failing_job(store: _SlowStore, src_tier: Tier, dst_tier: Tier, copy_fails: bool) -> None:
    device, host = DevicePool(LAYOUT, 8, "cpu"), HostPool(LAYOUT, 8)
    transfer_jobs = TransferJobs(device, host, store)  # type: ignore[arg-type]
    transfer_jobs.stage_pages = 2
    if copy_fails:  # the second staging copy fails while a store call is in flight
        copies = {"read": transfer_jobs._read, "write": transfer_jobs._write}
        count = [0]

        def failing(name: str) -> Callable[..., object]:
            def copy(*args: object) -> object:
                count[0] += 1
                if count[0] == 2:
                    raise RuntimeError("injected copy failure")
                return copies[name](*args)

            return copy

        transfer_jobs._read = failing("read")  # type: ignore[method-assign]
        transfer_jobs._write = failing("write")  # type: ignore[method-assign]
        transfer_jobs._copy_out = lambda *args: failing("copy out")  # type: ignore[method-assign]
        copies["copy out"] = lambda *args: None
    transfer_jobs.job(src_tier, dst_tier, [7, 2, 5, 0, 3, 1], [6, 1, 4, 2, 0, 3], [None] * 6)()


@pytest.mark.parametrize("streams_reads", [True, False])
@pytest.mark.parametrize("src_tier, dst_tier", [(Tier.HOST, Tier.DISK), (Tier.DISK, Tier.HOST)])
def test_a_failing_store_call_fails_the_job(
    src_tier: Tier, dst_tier: Tier, streams_reads: bool
) -> None:
    store = _SlowStore(fail_at=2, streams_reads=streams_reads)
    with pytest.raises(OSError, match="injected"):
        _failing_job(store, src_tier, dst_tier, copy_fails=False)
    # a write stages chunk k + 1 while chunk k is written, and so does a read one chunk at a
    # time; a streamed read has two chunks in flight and starts chunk 2 once chunk 0 is in,
    # before it sees chunk 1's failure
    streamed_read = streams_reads and src_tier is Tier.DISK
    assert store.calls == (3 if streamed_read else 2) and store.running == 0


@pytest.mark.parametrize("streams_reads", [True, False])
@pytest.mark.parametrize("src_tier, dst_tier", [(Tier.HOST, Tier.DISK), (Tier.DISK, Tier.HOST)])
def test_a_failing_copy_returns_only_after_the_store_call_in_flight(
    src_tier: Tier, dst_tier: Tier, streams_reads: bool
) -> None:
    store = _SlowStore(streams_reads=streams_reads)
    with pytest.raises(RuntimeError, match="injected"):
        _failing_job(store, src_tier, dst_tier, copy_fails=True)
    assert store.calls >= 1 and store.running == 0  # no store call outlives the job

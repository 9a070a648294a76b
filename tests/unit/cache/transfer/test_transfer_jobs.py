"""TransferJobs jobs move every byte of every page, in all directions, for shuffled page ids,
on both data paths (CPU page by page, and the staged path CUDA uses), in chunks, in place."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path

import pytest
import torch

from tests.unit.cache.disk.disk_cases import chain, open_store
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs

NUM_PAGES = 20
LAYOUTS = {
    # 256 B pages, bf16 (2-byte views; the store bounces unaligned page sizes)
    "bf16-256B": PageLayout(
        num_layers=2, num_kv_heads=1, head_dim=8, page_size=4, dtype=torch.bfloat16
    ),
    # 4 KiB pages, fp32: host runs move to and from O_DIRECT in place
    "fp32-4KiB": PageLayout(
        num_layers=2, num_kv_heads=1, head_dim=64, page_size=4, dtype=torch.float32
    ),
}


def _fill_random(tensor: torch.Tensor, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tensor.view(torch.int16).random_(generator=generator)  # every bit pattern, NaNs too


def _device_page(transfer_jobs: TransferJobs, page: int) -> torch.Tensor:
    # (layers, 2, pages, page_size, heads, dim) -> one page (layers, 2, page_size, heads, dim)
    return transfer_jobs.device_pool.kv[:, :, page].contiguous().view(torch.int16)


def _host_page(transfer_jobs: TransferJobs, page: int) -> torch.Tensor:
    return transfer_jobs.host_pool.kv[page].view(torch.int16)


def _transfer_jobs(layout: PageLayout, staged: bool, disk: DiskStore | None = None) -> TransferJobs:
    device = DevicePool(layout, NUM_PAGES, "cpu")
    host = HostPool(layout, NUM_PAGES)
    _fill_random(device.kv, 1)
    _fill_random(host.kv, 2)
    return TransferJobs(device, host, disk, staged=staged)


def _shuffled(count: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return rng.sample(range(NUM_PAGES), count), rng.sample(range(NUM_PAGES), count)


@pytest.fixture(params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> PageLayout:
    return LAYOUTS[request.param]


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("stage_pages", [1, 3, 64])
@pytest.mark.parametrize("count", [7, NUM_PAGES])  # 20 >= SPLIT_MIN_PAGES: a helper shares it
def test_memory_jobs_move_every_byte_of_shuffled_pages(
    layout: PageLayout, staged: bool, stage_pages: int, count: int
) -> None:
    transfer_jobs = _transfer_jobs(layout, staged)
    transfer_jobs.stage_pages = stage_pages  # chunked staging (the staged path) still moves all
    host_pages, device_pages = _shuffled(count, seed=stage_pages)
    before = {page: _host_page(transfer_jobs, page).clone() for page in range(NUM_PAGES)}

    assert (
        transfer_jobs.job(Tier.HOST, Tier.DEVICE, host_pages, device_pages, [])() == [True] * count
    )
    for host, device in zip(host_pages, device_pages, strict=True):
        assert torch.equal(_device_page(transfer_jobs, device), _host_page(transfer_jobs, host))

    _fill_random(transfer_jobs.device_pool.kv, 3)
    assert (
        transfer_jobs.job(Tier.DEVICE, Tier.HOST, device_pages, host_pages, [])() == [True] * count
    )
    for host, device in zip(host_pages, device_pages, strict=True):
        assert torch.equal(_host_page(transfer_jobs, host), _device_page(transfer_jobs, device))
    for page in set(range(NUM_PAGES)) - set(host_pages):  # nothing else was touched
        assert torch.equal(_host_page(transfer_jobs, page), before[page])


def test_consecutive_runs_move_as_one_copy(layout: PageLayout) -> None:
    transfer_jobs = _transfer_jobs(layout, staged=False)
    host_pages, device_pages = [3, 4, 5, 9, 10], [0, 1, 2, 7, 6]
    transfer_jobs.job(Tier.HOST, Tier.DEVICE, host_pages, device_pages, [])()
    for host, device in zip(host_pages, device_pages, strict=True):
        assert torch.equal(_device_page(transfer_jobs, device), _host_page(transfer_jobs, host))


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("consecutive", [False, True])
def test_disk_jobs_round_trip_every_byte(
    tmp_path: Path, layout: PageLayout, staged: bool, consecutive: bool
) -> None:
    store = open_store(tmp_path, layout=layout, capacity=1 << 20)
    transfer_jobs = _transfer_jobs(layout, staged, store)
    transfer_jobs.stage_pages = 3
    count = 8
    records = chain(count, layout=layout)
    host_pages = list(range(2, 2 + count)) if consecutive else _shuffled(count, 5)[0]
    device_pages = _shuffled(count, 6)[1]
    written = [_host_page(transfer_jobs, page).clone() for page in host_pages]
    device_written = [_device_page(transfer_jobs, page).clone() for page in device_pages]
    host_slots, device_slots = store.alloc(count), store.alloc(count)
    try:
        assert (
            transfer_jobs.job(Tier.HOST, Tier.DISK, host_pages, host_slots, records)()
            == [True] * count
        )
        assert (
            transfer_jobs.job(Tier.DEVICE, Tier.DISK, device_pages, device_slots, records)()
            == [True] * count
        )
        _fill_random(transfer_jobs.host_pool.kv, 7)
        _fill_random(transfer_jobs.device_pool.kv, 8)
        # slots read back in another order, into consecutive or other shuffled host pages
        order = random.Random(9).sample(range(count), count)
        back = host_pages if consecutive else _shuffled(count, 10)[0]
        read_slots = host_slots if consecutive else [host_slots[i] for i in order]
        expect = written if consecutive else [written[i] for i in order]
        read_records = records if consecutive else [records[i] for i in order]
        page_ok = transfer_jobs.job(Tier.DISK, Tier.HOST, read_slots, back, read_records)()
        assert page_ok == [True] * count
        for page, want in zip(back, expect, strict=True):
            assert torch.equal(_host_page(transfer_jobs, page), want)
        # disk -> device, and host-written records land in device pages too
        assert (
            transfer_jobs.job(Tier.DISK, Tier.DEVICE, device_slots, device_pages, records)()
            == [True] * count
        )
        for page, want in zip(device_pages, device_written, strict=True):
            assert torch.equal(_device_page(transfer_jobs, page), want)
    finally:
        store.close()


def test_a_record_that_fails_verification_is_a_miss_and_zeroed(
    tmp_path: Path, layout: PageLayout
) -> None:
    store = open_store(tmp_path, layout=layout, capacity=1 << 20)
    transfer_jobs = _transfer_jobs(layout, staged=False, disk=store)
    records = chain(4, layout=layout)
    slots = store.alloc(4)
    try:
        transfer_jobs.job(Tier.HOST, Tier.DISK, [0, 1, 2, 3], slots, records)()
        wrong = [records[0], records[2], records[2], records[3]]  # slot 1 holds another key
        page_ok = transfer_jobs.job(Tier.DISK, Tier.HOST, slots, [4, 5, 6, 7], wrong)()
        assert page_ok == [True, False, True, True]
        assert not _host_page(transfer_jobs, 5).any()
        assert torch.equal(_host_page(transfer_jobs, 6), _host_page(transfer_jobs, 2))
    finally:
        store.close()


@pytest.mark.parametrize("stage_pages", [1, 2, 64])
def test_a_read_into_the_device_copies_only_verified_pages(
    tmp_path: Path, layout: PageLayout, stage_pages: int
) -> None:
    """A store read into a CPU device pool is copied out as it is verified, chunks three at a
    time: every verified page lands, and a page that fails verification is never copied. The
    landing listeners hear of each verified page once, when its bytes are already there."""
    store = open_store(tmp_path, layout=layout, capacity=1 << 20)
    transfer_jobs = _transfer_jobs(layout, staged=False, disk=store)
    transfer_jobs.stage_pages = stage_pages
    records = chain(6, layout=layout)
    slots = store.alloc(6)
    device_pages = _shuffled(6, 12)[1]
    told: list[int] = []

    def landed(pages: list[int]) -> None:
        for page in pages:
            index = device_pages.index(page)
            assert torch.equal(_device_page(transfer_jobs, page), _host_page(transfer_jobs, index))
        told.extend(pages)

    try:
        transfer_jobs.job(Tier.HOST, Tier.DISK, [0, 1, 2, 3, 4, 5], slots, records)()
        assert not told  # a write to the disk lands nothing on the device
        before = [_device_page(transfer_jobs, page).clone() for page in device_pages]
        wrong = [*records[:3], records[4], *records[4:]]  # slot 3 holds another key
        transfer_jobs.device_landing_listeners.append(landed)
        page_ok = transfer_jobs.job(Tier.DISK, Tier.DEVICE, slots, device_pages, wrong)()
        assert page_ok == [True, True, True, False, True, True]
        assert sorted(told) == sorted(p for i, p in enumerate(device_pages) if i != 3)
        transfer_jobs.job(Tier.DISK, Tier.HOST, slots, [14, 15, 16, 17, 18, 19], records)()
        assert len(told) == 5  # nor does a read into host
        for index, page in enumerate(device_pages):
            want = before[index] if index == 3 else _host_page(transfer_jobs, index)
            assert torch.equal(_device_page(transfer_jobs, page), want)
    finally:
        store.close()


def test_a_streamed_read_keeps_three_chunks_in_flight(tmp_path: Path, layout: PageLayout) -> None:
    """Chunk k + 2's read must not wait for chunk k to be copied out (the disk sat idle
    meanwhile): the first three store reads of a disk -> device job run at once."""
    store = open_store(tmp_path, layout=layout, capacity=1 << 20)
    transfer_jobs = _transfer_jobs(layout, staged=False, disk=store)
    transfer_jobs.stage_pages = 1
    records, slots = chain(5, layout=layout), store.alloc(5)
    all_started = threading.Barrier(3, timeout=10)
    calls = itertools.count()
    read_pages = store.read_pages

    def read_three_at_once(*args):  # the first three reads wait for each other
        if next(calls) < 3:
            all_started.wait()  # BrokenBarrierError, failing the job, if only two are in flight
        return read_pages(*args)

    try:
        transfer_jobs.job(Tier.HOST, Tier.DISK, [0, 1, 2, 3, 4], slots, records)()
        store.read_pages = read_three_at_once  # type: ignore[method-assign]
        device_pages = _shuffled(5, 13)[1]
        assert (
            transfer_jobs.job(Tier.DISK, Tier.DEVICE, slots, device_pages, records)() == [True] * 5
        )
        for index, page in enumerate(device_pages):  # five chunks through three staging slots
            assert torch.equal(_device_page(transfer_jobs, page), _host_page(transfer_jobs, index))
    finally:
        store.close()


def test_reference_gather_and_scatter_match_index_select_for_shuffled_pages(
    layout: PageLayout,
) -> None:
    from tieredkv.kernels import reference

    transfer_jobs = _transfer_jobs(layout, staged=True)
    pool = transfer_jobs.device_pool.kv  # (layers, 2, pages, page_size, heads, dim)
    ids = torch.tensor(_shuffled(7, 11)[0])
    want = pool.index_select(2, ids).permute(2, 0, 1, 3, 4, 5).contiguous().view(torch.int16)
    assert torch.equal(reference.gather_pages(pool, ids).view(torch.int16), want)
    target = torch.zeros_like(pool)
    reference.scatter_pages(target, ids, reference.gather_pages(pool, ids))
    assert torch.equal(
        target.index_select(2, ids).view(torch.int16), pool.index_select(2, ids).view(torch.int16)
    )
    others = torch.tensor(sorted(set(range(NUM_PAGES)) - set(ids.tolist())))
    assert not target.index_select(2, others).view(torch.int16).any()
    with pytest.raises(IndexError):
        reference.gather_pages(pool, torch.tensor([0, NUM_PAGES]))
    with pytest.raises(IndexError):
        reference.scatter_pages(target, torch.tensor([-1]), want[:1].view(layout.dtype))

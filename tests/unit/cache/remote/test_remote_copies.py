"""Copy jobs from the remote tier into each pool, against a real Redis: into a CPU pool each
page goes from the fetch into its page (no staging); the CUDA data path (forced on CPU with
`staged=True`) goes through staging. Either way every page lands where it was asked, in any
order of destination pages, and a page missing from the store ends the job's hits there."""

from __future__ import annotations

import random

import pytest
import torch

from tests.unit.cache.disk.disk_cases import chain
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.remote.remote_tier import RemoteTier
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs

LAYOUT = PageLayout(num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, dtype=torch.bfloat16)
NUM_PAGES = 24
FLUSH_S = 10.0


def page_of(transfer_jobs: TransferJobs, tier: Tier, page: int) -> torch.Tensor:
    """The page's bytes in page-major order (layers, 2, page_size, heads, dim)."""
    if tier is Tier.DEVICE:
        return transfer_jobs.device_pool.kv[:, :, page].contiguous().view(torch.int16)
    return transfer_jobs.host_pool.kv[page].view(torch.int16)


@pytest.fixture
def remote(redis_server):
    store = RemoteStore(redis_server.url, b"fp", LAYOUT.page_size, LAYOUT.page_bytes)
    assert store.wait_healthy(FLUSH_S)
    yield RemoteTier(store, LAYOUT)
    store.close()


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("tier", [Tier.DEVICE, Tier.HOST])
def test_remote_pages_land_in_their_pages(remote: RemoteTier, staged: bool, tier: Tier) -> None:
    device, host = DevicePool(LAYOUT, NUM_PAGES, "cpu"), HostPool(LAYOUT, NUM_PAGES)
    payload = torch.empty((10, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    payload.view(torch.int16).random_(generator=torch.Generator().manual_seed(5))
    records = chain(10, layout=LAYOUT)
    remote.write_pages(list(range(10)), records, payload)
    assert remote.store.flush_writes(FLUSH_S)
    transfer_jobs = TransferJobs(device, host, None, staged=staged, remote=remote)
    transfer_jobs.stage_pages = 3  # several staging refills on the staged path
    pages = random.Random(6).sample(range(NUM_PAGES), 10)
    try:
        assert (
            transfer_jobs.job(Tier.REMOTE, tier, list(range(10)), pages, records)() == [True] * 10
        )
        for index, page in enumerate(pages):
            assert torch.equal(page_of(transfer_jobs, tier, page), payload[index].view(torch.int16))
        remote.store._client.redis.delete(remote.store.key_name(records[4].key))  # evicted
        got = transfer_jobs.job(Tier.REMOTE, tier, list(range(10)), pages, records)()
        assert got.index(False) == 4  # the cache keeps the pages before the first miss
    finally:
        transfer_jobs.close()


def test_remote_pages_into_the_device_are_told_to_landing_listeners_in_batches(
    remote: RemoteTier,
) -> None:
    device, host = DevicePool(LAYOUT, 40, "cpu"), HostPool(LAYOUT, 40)
    payload = torch.empty((20, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    payload.view(torch.int16).random_(generator=torch.Generator().manual_seed(7))
    records = chain(20, layout=LAYOUT)
    remote.write_pages(list(range(20)), records, payload)
    assert remote.store.flush_writes(FLUSH_S)
    transfer_jobs = TransferJobs(device, host, None, remote=remote)
    pages = random.Random(8).sample(range(40), 20)
    calls: list[list[int]] = []

    def landed(told: list[int]) -> None:
        for page in told:  # the bytes are in before the listener hears of them
            index = pages.index(page)
            assert torch.equal(
                page_of(transfer_jobs, Tier.DEVICE, page), payload[index].view(torch.int16)
            )
        calls.append(told)

    transfer_jobs.device_landing_listeners.append(landed)
    try:
        remote.store._client.redis.delete(remote.store.key_name(records[18].key))  # evicted
        got = transfer_jobs.job(Tier.REMOTE, Tier.DEVICE, list(range(20)), pages, records)()
        assert got.index(False) == 18
        assert [len(call) for call in calls] == [16, 3]  # every page delivered: all but one
        assert sorted(p for call in calls for p in call) == sorted(
            p for i, p in enumerate(pages) if i != 18
        )
    finally:
        transfer_jobs.close()

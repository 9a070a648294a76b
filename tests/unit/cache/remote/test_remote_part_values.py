"""A remote tier that keeps a page's parts apart (a model with sliding-window layers), against a
real Redis: every page's full part is a value, its sliding part a second value only where the
copy keeps it; a read hands each page on whole (zeros in the sliding layers of a page kept
without them), the look-up reports which pages lack the sliding part, and a page whose kept
sliding value is gone or replaced by another value is a miss, never a page with wrong layers."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tests.unit.cache.disk.disk_cases import chain
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.remote.keys import KEY_PREFIX
from tieredkv.cache.remote.part_values import sliding_key
from tieredkv.cache.remote.remote_tier import RemoteTier
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs

LAYOUT = PageLayout(num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, dtype=torch.bfloat16)
PARTS = PageParts(LAYOUT, full_layers=(0, 2), sliding_layers=(1,))
NUM_PAGES = 10
GAPS = frozenset({0, 1, 2, 3, 4, 6})  # pages 5, 7, 8, 9 keep their sliding part
FLUSH_S = 10.0


@pytest.fixture
def remote(redis_server):
    store = RemoteStore(redis_server.url, b"fp", LAYOUT.page_size, LAYOUT.page_bytes)
    assert store.wait_healthy(FLUSH_S)
    yield RemoteTier(store, LAYOUT, parts=PARTS)
    store.close()


def written(remote: RemoteTier, seed: int = 5):
    """Write NUM_PAGES random pages, those of GAPS without their sliding part; returns the
    records (as a reader names them) and the pages."""
    payload = torch.empty((NUM_PAGES, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    payload.view(torch.int16).random_(generator=torch.Generator().manual_seed(seed))
    records = [
        dataclasses.replace(record, sliding_held=index not in GAPS)
        for index, record in enumerate(chain(NUM_PAGES, layout=LAYOUT))
    ]
    remote.write_pages(list(range(NUM_PAGES)), records, payload)
    assert remote.store.flush_writes(FLUSH_S)
    return records, payload


def page_of(transfer_jobs: TransferJobs, tier: Tier, page: int) -> torch.Tensor:
    if tier is Tier.DEVICE:
        return transfer_jobs.device_pool.read_page(page).contiguous().view(torch.int16)
    return transfer_jobs.host_pool.kv[page].view(torch.int16)


def test_redis_holds_the_full_part_of_every_page_and_the_kept_sliding_parts(
    remote: RemoteTier, redis_server
) -> None:
    records, _ = written(remote)
    client = redis_server.client()
    values = {key.decode(): client.get(key) for key in client.keys(KEY_PREFIX + "*")}
    assert len(values) == NUM_PAGES + NUM_PAGES - len(GAPS)
    store = remote.store
    for index, record in enumerate(records):
        assert store.key_name(record.key) in values
        assert (store.key_name(sliding_key(record.key)) in values) == (index not in GAPS)
    full = sum(len(values[store.key_name(record.key)]) for record in records)
    sliding_bytes = [
        len(v) for k, v in values.items() if k not in {store.key_name(r.key) for r in records}
    ]
    assert full < NUM_PAGES * LAYOUT.page_bytes  # two layers of three a page
    assert all(size < PARTS.full_bytes for size in sliding_bytes)  # one layer
    assert remote.lookup([record.key for record in records]) == (NUM_PAGES, GAPS)


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("tier", [Tier.DEVICE, Tier.HOST])
def test_pages_land_whole_with_zeros_where_the_copy_keeps_no_sliding_part(
    remote: RemoteTier, staged: bool, tier: Tier
) -> None:
    records, payload = written(remote)
    device, host = DevicePool(LAYOUT, 24, "cpu"), HostPool(LAYOUT, 24)
    device.kv.fill_(1.0)
    host.kv.fill_(1.0)  # stale bytes a gap must not keep
    transfer_jobs = TransferJobs(device, host, None, staged=staged, remote=remote)
    transfer_jobs.stage_pages = 3
    pages = random.Random(6).sample(range(24), NUM_PAGES)
    try:
        slots = list(range(NUM_PAGES))
        assert transfer_jobs.job(Tier.REMOTE, tier, slots, pages, records)() == [True] * 10
        for index, page in enumerate(pages):
            expected = payload[index].clone()
            if index in GAPS:
                expected[list(PARTS.sliding_layers)] = 0
            assert torch.equal(page_of(transfer_jobs, tier, page), expected.view(torch.int16))
    finally:
        transfer_jobs.close()


def test_a_kept_sliding_value_gone_or_swapped_makes_its_page_a_miss(
    remote: RemoteTier, redis_server
) -> None:
    records, _ = written(remote)
    client, store = redis_server.client(), remote.store
    device, host = DevicePool(LAYOUT, 24, "cpu"), HostPool(LAYOUT, 24)
    transfer_jobs = TransferJobs(device, host, None, remote=remote)
    slots, pages = list(range(NUM_PAGES)), list(range(NUM_PAGES))
    try:
        client.delete(store.key_name(sliding_key(records[7].key)))  # evicted by Redis's LRU
        got = transfer_jobs.job(Tier.REMOTE, Tier.HOST, slots, pages, records)()
        assert got.index(False) == 7
        assert remote.lookup([record.key for record in records]) == (NUM_PAGES, GAPS | {7})
        # page 5's full value copied under its sliding part's name: sealed with another name
        # and size (refused for its size first; a part of the same size for its name)
        full = client.get(store.key_name(records[5].key))
        client.set(store.key_name(sliding_key(records[5].key)), full)
        got = transfer_jobs.job(Tier.REMOTE, Tier.HOST, slots, pages, records)()
        assert got.index(False) == 5
        assert store.counters().refused["fingerprint"] == 1
    finally:
        transfer_jobs.close()

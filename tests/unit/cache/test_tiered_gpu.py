"""The CUDA paths: pinned host pool, copies on dedicated streams, disk -> device via a bounce
buffer. Skipped without a GPU."""

from pathlib import Path

import pytest
import torch

from tests.support.tiny_cache import FINGERPRINT, disk_bytes_for, expected_pages, tiny_layout
from tieredkv.cache.build import build_cache
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig, WritePolicy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
LAYOUT = tiny_layout(page_size=4)


def _fill(cache: TieredCache, tokens: list[int], namespace: str) -> None:
    while (pages := cache.allocate(len(tokens) // LAYOUT.page_size)) is None:
        cache.wait(timeout=10)  # demotions to host/disk free the pages
    for page, contents in zip(pages, expected_pages(tokens, namespace, LAYOUT), strict=False):
        cache.device_pool.kv[:, :, page] = contents.cuda()
    result = cache.insert(tokens, namespace, pages)
    cache.free([p for p in pages if p not in result.device_pages])


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_round_trip_through_host_and_disk_on_cuda(tmp_path: Path, policy: WritePolicy) -> None:
    config = CacheConfig(
        page_size=4,
        device_cache_bytes=4 * LAYOUT.page_bytes,
        host_cache_bytes=4 * LAYOUT.page_bytes,
        disk_cache_dir=tmp_path,
        disk_cache_bytes=disk_bytes_for(LAYOUT, 32),
        write_policy=policy,
    )
    cache = build_cache(config, LAYOUT, FINGERPRINT, "cuda")
    assert cache.host_pool.pinned
    prompts = [[i] * 16 + [0] for i in range(1, 5)]
    for tokens in prompts:
        _fill(cache, tokens, "gpu")
    for tokens in prompts:
        match = cache.match(tokens, "gpu")
        assert match.matched_len == 16
        cache.lock(match.last_node)
        while (ticket := cache.promote(match)) is None:
            cache.wait(timeout=10)
        while not ticket.done:
            cache.wait(timeout=10)
        assert ticket.num_ready_pages == 4
        for page, want in zip(
            ticket.device_pages, expected_pages(tokens, "gpu", LAYOUT), strict=False
        ):
            assert torch.equal(cache.device_pool.kv[:, :, page].cpu(), want)
        cache.unlock(match.last_node)
        result = cache.check_integrity()
        assert result.ok, result.problems
    assert cache.counters.transfer_bytes[Tier.DEVICE, Tier.HOST] > 0
    cache.close()

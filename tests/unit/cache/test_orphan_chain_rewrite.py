"""A disk chain whose first record was lost hangs, after a restart, from that page's key,
unmatched. When a live path computes the lost page again and is written to disk, the old chain
after it goes first: the disk never records a page twice, and the page events never report one
stored twice (found by the state machine in tests/property)."""

from __future__ import annotations

import torch

from tests.support.page_view import PageView
from tests.support.tiny_cache import FINGERPRINT, make_cache, tiny_layout
from tests.unit.cache.cache_steps import compute, ok, settle
from tieredkv.cache.index.page_key import namespace_root_key, page_key
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import WritePolicy

LAYOUT = tiny_layout(page_size=4)
TOKENS = list(range(100, 112))  # three pages
OTHER = b"other chain" * 2  # 22 bytes: only a key's first 16 matter here


def on_disk(tmp_path, view: PageView):
    return make_cache(
        LAYOUT, device_pages=8, disk_pages=16, disk_dir=tmp_path,
        write_policy=WritePolicy.WRITE_BACK, page_listener=view,
    )  # fmt: skip


def written_down(cache: TieredCache, executor) -> None:
    compute(cache, TOKENS)
    cache.evict(Tier.DEVICE, 8)  # to disk, then freed on the device
    settle(cache, executor)
    assert cache.match([*TOKENS, 1]).disk.num_pages == 3


def test_a_recomputed_lost_page_replaces_the_chain_that_hung_from_it(tmp_path) -> None:
    cache, executor = on_disk(tmp_path, PageView())
    written_down(cache, executor)
    slot = cache.match([*TOKENS, 1]).disk.nodes[0].residence.copies[Tier.DISK][0]
    tokens = tuple(TOKENS[:4])
    lost = PageRecord(page_key(OTHER[:16], tokens), OTHER[:16], tokens)  # another chain's
    zeros = torch.zeros((1, *LAYOUT.page_shape), dtype=LAYOUT.dtype)
    cache.pools.disk.write_pages([slot], [lost], zeros)  # page 0's record is gone
    cache.close()
    view = PageView()
    cache, executor = on_disk(tmp_path, view)
    page0 = page_key(namespace_root_key(FINGERPRINT, "default"), tokens)
    assert page0 in cache.residency.rebuilt_roots  # pages 1 and 2 hang from it, unmatched
    assert cache.match([*TOKENS, 1]).matched_len == 0
    assert len(view.tiers[Tier.DISK]) == 3  # the other chain's page and pages 1 and 2
    written_down(cache, executor)  # no page stored twice (PageView refuses it)
    assert len(view.tiers[Tier.DISK]) == 4  # pages 0, 1, 2 once each, and the other page
    assert cache.pools.disk.num_used == 4
    ok(cache)
    cache.close()

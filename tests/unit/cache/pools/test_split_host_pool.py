"""The host tier a layer page at a time: as many pages as whole pages where every page keeps its
sliding part and more where fewer do, each page's full layers kept, its sliding layers kept
where it has a sliding part (zeros read back where it has none), through the copies every
transfer uses, both ways and with the device's layout."""

from __future__ import annotations

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_host_pool import SplitHostPool
from tieredkv.cache.transfer.layout_copy import PageRows, copy_pages
from tieredkv.cache.transfer.split_rows import SplitPageRows
from tieredkv.model_config import ModelConfig

MODEL = ModelConfig(
    vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=6, num_heads=4,
    num_kv_heads=2, head_dim=16, layer_windows=(32, 32, None, 32, 32, None),
)  # fmt: skip


def parts_of(dtype: torch.dtype = torch.float32) -> PageParts:
    return PageParts.of(MODEL, PageLayout.for_model(MODEL, 4, dtype))


def test_the_same_bytes_hold_whole_pages_or_more_full_parts() -> None:
    parts = parts_of()
    capacity = 100 * parts.layout.page_bytes
    pool = SplitHostPool.from_bytes(parts, capacity, pin_memory=False)
    assert HostPool.from_bytes(parts.layout, capacity).num_pages == 100
    # a page: 2 full layers and 4 sliding ones; 600 layer pages
    assert pool.num_units == 600 and pool.capacity_bytes == capacity
    assert pool.num_pages == pool.num_free == 300  # with no sliding part at all
    pages = pool.alloc(50)
    assert pool.attach_sliding(pages) == pages  # 50 whole pages: 300 layer pages
    assert pool.num_free == 150 and pool.num_pages == 200
    assert pool.sliding_room() == 75 and pool.sliding_room(pages=150) == 0
    assert pool.used_bytes == 50 * parts.layout.page_bytes
    pool.detach_sliding(pages[:10])
    assert pool.num_free == 170 and pool.num_sliding_held == 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pages_keep_their_full_part_and_the_sliding_part_they_were_given(dtype) -> None:
    parts = parts_of(dtype)
    pool = SplitHostPool(parts, num_units=4 * 2 + 2 * 4, pin_memory=False)  # 4 pages, 2 whole
    rows = SplitPageRows(pool)
    pages = pool.alloc(4)
    assert pool.attach_sliding([pages[1], pages[3], pages[0]]) == [pages[1], pages[3]]
    assert pool.lacking(pages) == frozenset({0, 2})
    source = torch.randn(4, *parts.layout.page_shape).to(dtype)  # page-major, like staging
    copy_pages(rows, pages, PageRows.page_major(source), [0, 1, 2, 3])
    back = torch.full_like(source, 7.0)
    copy_pages(PageRows.page_major(back), [0, 1, 2, 3], rows, pages)
    full, sliding = list(parts.full_layers), list(parts.sliding_layers)
    assert torch.equal(back[:, full], source[:, full])
    assert torch.equal(back[[1, 3]][:, sliding], source[[1, 3]][:, sliding])
    assert not back[[0, 2]][:, sliding].any()  # no sliding part: zeros
    assert pool.used_bytes == 4 * parts.full_bytes + 2 * parts.sliding_bytes
    pool.free(pages[:2])
    assert pool.sliding_room() == 2 and pool.lacking([pages[3]]) == frozenset()  # 8 freed
    assert pool.units[pool.zero_unit].count_nonzero() == 0  # what a missing layer reads


def test_copies_with_a_layer_major_device_pool() -> None:
    parts = parts_of()
    pool = SplitHostPool(parts, num_units=5 * 2 + 3 * 4, pin_memory=False)
    pages = pool.alloc(5)
    pool.attach_sliding(pages[2:])
    layout = parts.layout
    device = torch.randn(layout.num_layers, 2, 9, 4, 2, 16)  # (layers, 2, pages, ps, kv, hd)
    device_rows = PageRows.layer_major(device)
    copy_pages(SplitPageRows(pool), pages, device_rows, [8, 1, 2, 3, 4])
    again = torch.zeros_like(device)
    copy_pages(PageRows.layer_major(again), [0, 1, 2, 3, 4], SplitPageRows(pool), pages)
    full, sliding = list(parts.full_layers), list(parts.sliding_layers)
    assert torch.equal(again[full][:, :, :5], device[full][:, :, [8, 1, 2, 3, 4]])
    assert torch.equal(again[sliding][:, :, 2:5], device[sliding][:, :, 2:5])
    assert not again[sliding][:, :, :2].any()


def test_a_store_payload_lands_in_its_layer_pages() -> None:
    parts = parts_of()
    pool = SplitHostPool(parts, num_units=2 * 2 + 4, pin_memory=False)
    pages = pool.alloc(2)
    pool.attach_sliding([pages[0]])
    payload = torch.randn(*parts.layout.page_shape)
    rows = SplitPageRows(pool)
    rows.put(pages[0], memoryview(payload.numpy().tobytes()))
    back = torch.zeros(1, *parts.layout.page_shape)
    copy_pages(PageRows.page_major(back), [0], rows, [pages[0]])
    assert torch.equal(back[0], payload)

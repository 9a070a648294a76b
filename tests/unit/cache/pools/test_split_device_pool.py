"""The device tier a layer page at a time: pages allocated whole, their sliding parts detached
as nothing reads them and the layer pages reused for other pages; attention, the workspaces and
the copies (page by page on a CPU pool, staged as on CUDA) read and write the same KV as in a
whole-page pool, zeros where a page has no sliding part."""

from __future__ import annotations

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.transfer_jobs import TransferJobs
from tieredkv.errors import OutOfPagesError
from tieredkv.model_config import ModelConfig

MODEL = ModelConfig(
    vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=6, num_heads=4,
    num_kv_heads=2, head_dim=16, layer_windows=(32, 32, None, 32, 32, None),
)  # fmt: skip
LAYOUT = PageLayout.for_model(MODEL, 4, torch.float32)
PARTS = PageParts.of(MODEL, LAYOUT)
SLIDING = list(PARTS.sliding_layers)
FULL = list(PARTS.full_layers)


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)
DEVICES = pytest.mark.parametrize("device", ["cpu", CUDA])
CUDA_STAGED = pytest.param("cuda", True, marks=CUDA.marks)


def pools(num_pages: int = 10, device: str = "cpu") -> tuple[SplitDevicePool, DevicePool]:
    """A split pool and a whole-page one of the same bytes."""
    return (
        SplitDevicePool.from_bytes(PARTS, num_pages * LAYOUT.page_bytes, device),
        DevicePool(LAYOUT, num_pages, device),
    )


def store_random(split: SplitDevicePool, whole: DevicePool, count: int) -> tuple[list, list]:
    """`count` pages of each, the same random KV stored in every layer through `store`."""
    pages, whole_pages = split.alloc(count), whole.alloc(count)
    device = split.device
    slots = torch.tensor([p * 4 + o for p in pages for o in range(4)], device=device)
    whole_slots = torch.tensor([p * 4 + o for p in whole_pages for o in range(4)], device=device)
    generator = torch.Generator().manual_seed(count)
    for layer in range(LAYOUT.num_layers):
        k, v = (torch.randn(count * 4, 2, 16, generator=generator).to(device) for _ in range(2))
        split.store(layer, k, v, slots)
        whole.store(layer, k, v, whole_slots)
    return pages, whole_pages


def test_pages_are_whole_and_detached_sliding_parts_make_room() -> None:
    split, _ = pools()
    assert split.num_units == 60 and split.num_free == 10 and split.max_pages == 30
    pages = split.alloc(5)
    assert split.num_free == 5 and split.num_sliding_held == 5
    split.detach_sliding(pages[:3])  # 3 x 4 sliding layer pages: 2 whole pages
    assert split.num_free == 7 and split.num_pages == 12
    assert split.held_page_equivalents(pages) == 3  # 2 whole + 3 x 2 full layers of 6
    with pytest.raises(OutOfPagesError):
        split.alloc(8)
    assert split.num_free == 7  # nothing taken by the refusal
    split.free(pages)
    assert split.num_free == 10 and split.unit_free.num_free == 60


@DEVICES
def test_attention_and_workspaces_read_what_a_whole_page_pool_holds(device: str) -> None:
    split, whole = pools(device=device)
    pages, whole_pages = store_random(split, whole, 5)
    table = torch.tensor([pages], dtype=torch.int32, device=device)
    for layer in range(LAYOUT.num_layers):
        run = split.layer_run(slice(layer, layer + 1), pages[0], 5)
        assert torch.equal(run, whole.layer_run(slice(layer, layer + 1), whole_pages[0], 5))
        k_pages, v_pages = split.layer_kv(layer)
        units = split.layer_table(layer, table)[0].long()
        assert torch.equal(k_pages[units], whole.layer_kv(layer)[0][whole_pages])
        assert torch.equal(v_pages[units], whole.layer_kv(layer)[1][whole_pages])
    split.detach_sliding(pages[:2])
    for layer in SLIDING:  # read as the zero layer page; written into the discarded one
        assert not split.layer_run(slice(layer, layer + 1), pages[0], 2).any()
    ones = torch.ones(4, 2, 16, device=device)
    split.store(SLIDING[0], ones, ones, torch.arange(4, device=device))
    assert not split.read_page(pages[0]).any(dim=(1, 2, 3, 4))[SLIDING].any()
    assert torch.equal(split.read_page(pages[0])[FULL], whole.read_page(whole_pages[0])[FULL])


@DEVICES
def test_a_copy_of_pages_copies_every_layer_zeros_for_a_missing_part(device: str) -> None:
    split, whole = pools(device=device)
    pages, whole_pages = store_random(split, whole, 3)
    split.detach_sliding(pages[:1])
    targets = split.alloc(3)
    split.copy_pages(pages, targets)
    for source, target, whole_page in zip(pages, targets, whole_pages, strict=True):
        assert torch.equal(split.read_page(target), split.read_page(source))
        assert torch.equal(split.read_page(target)[FULL], whole.read_page(whole_page)[FULL])
    assert not split.read_page(targets[0])[SLIDING].any()


@pytest.mark.parametrize(("device", "staged"), [("cpu", False), ("cpu", True), CUDA_STAGED])
def test_transfers_move_the_same_bytes_as_from_a_whole_page_pool(device: str, staged: bool) -> None:
    split, whole = pools(device=device)
    pages, whole_pages = store_random(split, whole, 4)
    split.detach_sliding(pages[1:2])
    down, back = HostPool(LAYOUT, 8), HostPool(LAYOUT, 8)
    jobs = TransferJobs(split, down, None, staged=staged)
    whole_jobs = TransferJobs(whole, back, None, staged=staged)
    jobs.job(Tier.DEVICE, Tier.HOST, pages, [0, 1, 2, 3], [])()
    whole_jobs.job(Tier.DEVICE, Tier.HOST, whole_pages, [0, 1, 2, 3], [])()
    assert not down.kv[1][SLIDING].any()  # the page without its part: zeros there
    for index in (0, 2, 3):
        assert torch.equal(down.kv[index], back.kv[index])
    assert torch.equal(down.kv[1][FULL], back.kv[1][FULL])
    into = split.alloc(4)
    split.detach_sliding(into[2:3])  # a promotion of a page without its part
    jobs.job(Tier.HOST, Tier.DEVICE, [0, 1, 2, 3], into, [])()
    for index, page in enumerate(into):
        expected = down.kv[index].clone()
        if index == 2:
            expected[SLIDING] = 0
        assert torch.equal(split.read_page(page).cpu(), expected)
    jobs.close()
    whole_jobs.close()

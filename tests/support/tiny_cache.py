"""A tiny layout, a tiered cache on manual executors, and page contents derived from page keys,
so any test can check that a page holds the bytes that were inserted for that exact prefix and
namespace."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

from tests.support.manual_executor import ManualTransferExecutor
from tieredkv.cache.build import build_cache
from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.format import SUPERBLOCK_BYTES, align_up, header_bytes_for
from tieredkv.cache.index.page_key import chain_keys, namespace_root_key
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_listener import PageListener
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.model_config import ModelConfig

FINGERPRINT = b"tieredkv-test-model"


def tiny_layout(page_size: int = 4) -> PageLayout:
    """2 layers, 1 kv head of 4 dims, fp32: 256 B pages at page_size 4."""
    return PageLayout(
        num_layers=2, num_kv_heads=1, head_dim=4, page_size=page_size, dtype=torch.float32
    )


def disk_bytes_for(layout: PageLayout, num_pages: int, layer_records: bool = False) -> int:
    """A disk capacity holding at least `num_pages` records (0 disables the tier); with
    `layer_records`, the layer records of `num_pages` whole pages (a split disk store)."""
    if num_pages == 0:
        return 0
    if layer_records:
        layer = dataclasses.replace(layout, num_layers=1)
        return disk_bytes_for(layer, num_pages * layout.num_layers)
    record = header_bytes_for(layout.page_size) + align_up(layout.page_bytes)
    return SUPERBLOCK_BYTES + num_pages * record + align_up(1)


def make_cache(
    layout: PageLayout,
    device_pages: int,
    host_pages: int = 0,
    disk_pages: int = 0,
    disk_dir: Path | None = None,
    write_policy: WritePolicy = WritePolicy.WRITE_BACK,
    disk_io: DiskIOBackend | None = None,
    executor: ManualTransferExecutor | None = None,
    namespace_share: float | None = None,
    page_listener: PageListener | None = None,
    retention_pages: int | None = None,
    model: ModelConfig | None = None,
    split_host: bool = False,
    split_device: bool = False,
    split_disk: bool = False,
) -> tuple[TieredCache, ManualTransferExecutor]:
    """A cache whose transfers run only when the test completes their tickets."""
    executor = executor or ManualTransferExecutor()
    config = CacheConfig(
        page_size=layout.page_size,
        device_cache_bytes=device_pages * layout.page_bytes,
        host_cache_bytes=host_pages * layout.page_bytes,
        disk_cache_dir=disk_dir if disk_pages else None,
        disk_cache_bytes=disk_bytes_for(layout, disk_pages, layer_records=split_disk),
        write_policy=write_policy,
        namespace_share=namespace_share,
        host_whole_pages=not split_host,  # whole host pages unless asked
        device_whole_pages=not split_device,  # and whole device pages
        disk_whole_pages=not split_disk,  # and whole-page disk records
        retention_budget_bytes=(
            None if retention_pages is None else retention_pages * layout.page_bytes
        ),
    )
    cache = build_cache(
        config,
        layout,
        FINGERPRINT,
        "cpu",
        disk_io=disk_io,
        memory_executor=executor,
        disk_executor=executor,
        page_listener=page_listener,
        model=model,
    )
    return cache, executor


def page_contents(key: bytes, layout: PageLayout) -> torch.Tensor:
    """Deterministic KV for the page with this key: (layers, 2, page_size, kv_heads, head_dim)."""
    generator = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
    return torch.rand(layout.page_shape, generator=generator).to(layout.dtype)


def expected_pages(tokens: Sequence[int], namespace: str, layout: PageLayout) -> list[torch.Tensor]:
    """The contents every full page of `tokens` must hold in `namespace`."""
    root = namespace_root_key(FINGERPRINT, namespace)
    return [page_contents(key, layout) for key in chain_keys(root, tokens, layout.page_size)]


def fill_device_pages(
    cache: TieredCache, tokens: Sequence[int], namespace: str, pages: Sequence[int]
) -> None:
    """Write the expected contents of the full pages of `tokens` into device `pages`."""
    for page, contents in zip(pages, expected_pages(tokens, namespace, cache.layout), strict=False):
        cache.device_pool.write_page(page, contents)


def device_page(cache: TieredCache, page: int) -> torch.Tensor:
    """A device page as (layers, 2, page_size, kv_heads, head_dim)."""
    return cache.device_pool.read_page(page)

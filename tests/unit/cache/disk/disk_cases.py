"""Shared helpers for the disk store tests: a tiny layout, chained records, random pages."""

from __future__ import annotations

from pathlib import Path

import torch

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.format import SUPERBLOCK_BYTES, Superblock, decode_superblock
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.index.page_key import namespace_root_key, page_key
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_record import PageRecord

# 2 layers x 2 (K, V) x 4 tokens x 1 head x 8 dims x 2 B = 256 B per page
LAYOUT = PageLayout(num_layers=2, num_kv_heads=1, head_dim=8, page_size=4, dtype=torch.bfloat16)
FINGERPRINT = b"tiny-test-model"
CAPACITY = 64 << 10  # 14 records of 4 KiB


def chain(count: int, namespace: str = "ns", layout: PageLayout = LAYOUT) -> list[PageRecord]:
    """`count` records of one conversation, each page the child of the previous one."""
    parent = namespace_root_key(FINGERPRINT, namespace)
    records = []
    for index in range(count):
        tokens = tuple(range(index * layout.page_size, (index + 1) * layout.page_size))
        key = page_key(parent, tokens)
        records.append(PageRecord(key, parent, tokens))
        parent = key
    return records


def random_pages(count: int, seed: int = 0, layout: PageLayout = LAYOUT) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    pages = torch.randn((count, *layout.page_shape), generator=generator)
    return pages.to(layout.dtype)  # (count, layers, 2, page_size, kv_heads, head_dim)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bytes(a.view(torch.uint8).numpy()) == bytes(
        b.view(torch.uint8).numpy()
    )


def open_store(
    directory: Path,
    io: DiskIOBackend | None = None,
    codec: str = "raw",
    capacity: int = CAPACITY,
    layout: PageLayout = LAYOUT,
    fingerprint: bytes = FINGERPRINT,
) -> DiskStore:
    return DiskStore(directory, fingerprint, layout, capacity, io=io, codec=codec)


def read_superblock(path: Path) -> Superblock:
    return decode_superblock(path.read_bytes()[:SUPERBLOCK_BYTES])


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        value = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([value ^ 0x5A]))

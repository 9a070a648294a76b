"""The host tier's memory: one page-major KV tensor and its free list.

Layout `[num_pages, num_layers, 2, page_size, num_kv_heads, head_dim]`: each page is one
contiguous run of bytes (all layers), so it moves to disk with one write and to the device with
one copy. Pinned when CUDA is present, so host<->device copies can run asynchronously.
"""

from __future__ import annotations

import torch

from tieredkv.cache.device_pool import PageLayout
from tieredkv.errors import ConfigError, OutOfPagesError


class HostPool:
    """Owns the host KV tensor and a LIFO free list of page ids.

    `num_pages == 0` is a disabled tier (`--host-cache-size 0`). Not thread-safe: only the
    engine thread allocates and frees; mover threads only copy bytes of pages they were given.
    """

    def __init__(self, layout: PageLayout, num_pages: int, pin_memory: bool | None = None) -> None:
        if num_pages < 0:
            raise ConfigError(f"HostPool num_pages must be >= 0, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        self.pinned = pin_memory and num_pages > 0
        # (num_pages, layers, 2, page_size, kv_heads, head_dim)
        self.kv = torch.zeros(
            (num_pages, *layout.page_shape), dtype=layout.dtype, pin_memory=self.pinned
        )
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @classmethod
    def from_bytes(cls, layout: PageLayout, capacity_bytes: int) -> HostPool:
        """As many whole pages as fit in `capacity_bytes` (0 disables the tier)."""
        return cls(layout, capacity_bytes // layout.page_bytes)

    @property
    def enabled(self) -> bool:
        return self.num_pages > 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def capacity_bytes(self) -> int:
        return self.num_pages * self.layout.page_bytes

    def alloc(self, count: int) -> list[int]:
        """Take `count` pages, all or nothing."""
        if count > len(self._free):
            raise OutOfPagesError(f"host pool: asked for {count} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            self._is_free[page] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for page in pages:
            assert not self._is_free[page], f"host page {page} freed twice"
            self._is_free[page] = True
            self._free.append(page)

    def is_free(self, page: int) -> bool:
        return self._is_free[page]

    def used_pages(self) -> list[int]:
        return [page for page, free in enumerate(self._is_free) if not free]

"""The host tier's memory: one page-major KV tensor and its free list.

Layout `[num_pages, num_layers, 2, page_size, num_kv_heads, head_dim]`: each page is one
contiguous run of bytes (all layers), so it moves to disk with one write and to the device with
one copy. Pinned when CUDA is present, so host<->device copies can run asynchronously;
otherwise page-aligned (an anonymous mapping), so a run of host pages moves to and from an
O_DIRECT disk store in place, without a bounce copy. A server's engine faults that mapping in
while it is idle (`prefault_some`), so write-through does not pay each page's first touch on a
request's time; pinned memory is resident from the start.
"""

from __future__ import annotations

import torch

from tieredkv.cache.page_layout import PageLayout, aligned_empty
from tieredkv.cache.pools.free_list import PageFreeList, PagePool
from tieredkv.cache.pools.prefault import Prefaulter
from tieredkv.cache.tier import Tier
from tieredkv.errors import ConfigError

PREFAULT_AHEAD_BYTES = 256 << 20  # faulted in ahead of the highest page handed out so far


class HostPool(PagePool):
    """Owns the host KV tensor and a LIFO free list of page ids.

    `num_pages == 0` is a disabled tier (`--host-cache-size 0`). Not thread-safe: only the
    engine thread allocates and frees; transfer threads only copy bytes of pages they were given.
    """

    tier = Tier.HOST

    def __init__(self, layout: PageLayout, num_pages: int, pin_memory: bool | None = None) -> None:
        if num_pages < 0:
            raise ConfigError(f"HostPool num_pages must be >= 0, got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        self.pinned = pin_memory and num_pages > 0
        shape = (num_pages, *layout.page_shape)
        self.prefaulter: Prefaulter | None = None  # the anonymous mapping's, when not pinned
        self._pages_handed_out = 0  # 1 + the highest page id ever allocated
        if self.pinned:  # cudaHostAlloc memory is page-aligned too
            self.kv = torch.zeros(shape, dtype=layout.dtype, pin_memory=True)
        else:  # zero-filled by the kernel, page by page on first touch
            raw = aligned_empty(num_pages * layout.page_bytes)
            if num_pages:
                self.prefaulter = Prefaulter(raw)
            # (num_pages, layers, 2, page_size, kv_heads, head_dim)
            self.kv = torch.from_numpy(raw).view(layout.dtype).view(shape)
        self.page_bytes = layout.page_bytes
        self.free_list = PageFreeList(num_pages, self.tier.label)

    @classmethod
    def from_bytes(cls, layout: PageLayout, capacity_bytes: int) -> HostPool:
        """As many whole pages as fit in `capacity_bytes` (0 disables the tier)."""
        return cls(layout, capacity_bytes // layout.page_bytes)

    @property
    def enabled(self) -> bool:
        return self.num_pages > 0

    def alloc(self, count: int) -> list[int]:
        pages = self.free_list.alloc(count)
        if pages:
            self._pages_handed_out = max(self._pages_handed_out, max(pages) + 1)
        return pages

    def prefault_some(self) -> bool:
        """Fault in the next chunk of the pool's memory, up to PREFAULT_AHEAD_BYTES past the
        highest page handed out (the free list hands out the lowest first), on the engine
        thread when idle; True while more remains below that."""
        if self.prefaulter is None:
            return False
        window_end = self._pages_handed_out * self.page_bytes + PREFAULT_AHEAD_BYTES
        return self.prefaulter.step(up_to=window_end)

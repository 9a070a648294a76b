"""A running sequence's contiguous KV on CPU, and its one-time fill from the paged pool.

The pool stores a page as (layers, 2, page_size, kv_heads, head_dim) slices of a layer-major
tensor; the workspace is head-major, (layers, 2, kv_heads, capacity, head_dim), the layout the
attention matmuls read. A cached prefix is copied in once, when the sequence starts: page runs
that are consecutive in the pool move with one strided numpy copy each (numpy releases the GIL),
split over two threads. Measured on this 2-core machine for a 3.2k-token fp32 prefix (147 MB):
80 ms with torch index_select + transpose, about 21 ms this way.

A fresh workspace of that size costs more than its fill: about 45 ms of first-touch page faults
(the allocator returns big buffers to the kernel on free). So released workspaces are kept as
spares (`SpareWorkspaces`) and the next sequences reuse them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from tieredkv.cache.device_pool import DevicePool
from tieredkv.cache.page_rows import paired_runs

ROUNDING = 256  # tokens; workspaces grow in these steps at least, doubling beyond
_PARALLEL_MIN_TOKENS = 512  # below this one thread copies faster than two coordinate
SPARES = 2  # released workspaces kept for reuse (bounded memory: at most this many)
_fill_helper = ThreadPoolExecutor(1, thread_name_prefix="tkv-fill")


def _numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as numpy integers of its element size (numpy has no bfloat16)."""
    view_dtype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(view_dtype).numpy()


class Workspace:
    """A running sequence's KV, contiguous: (layers, 2, kv_heads, capacity, head_dim)."""

    def __init__(self, pool: DevicePool, capacity: int) -> None:
        assert pool.device.type == "cpu", "workspaces are the CPU attention path"
        layout = pool.layout
        self.kv = torch.empty(
            (layout.num_layers, 2, layout.num_kv_heads, capacity, layout.head_dim),
            dtype=layout.dtype,
        )
        self.length = 0

    @classmethod
    def for_tokens(cls, pool: DevicePool, tokens: int) -> Workspace:
        return cls(pool, -(-tokens // ROUNDING) * ROUNDING)

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self.capacity)
        capacity = -(-capacity // ROUNDING) * ROUNDING
        bigger = self.kv.new_empty((*self.kv.shape[:3], capacity, self.kv.shape[4]))
        bigger[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = bigger

    def fill_from_pool(self, pool: DevicePool, page_ids: list[int], length: int) -> None:
        """Copy the first `length` tokens' KV from the pool pages `page_ids` (in order)."""
        if length > self.capacity:
            self.grow(length)
        page_size = pool.layout.page_size
        num_pages = -(-length // page_size)
        pages = list(page_ids[:num_pages])
        # (pool start, workspace start page, count) per run consecutive in the pool
        runs = paired_runs(pages, list(range(num_pages)))
        src = _numpy_view(pool.kv)  # (layers, 2, pool pages, page_size, kv_heads, head_dim)
        dst = _numpy_view(self.kv)  # (layers, 2, kv_heads, capacity, head_dim)

        def copy(part: list[tuple[int, int, int]]) -> None:
            for first, at, count in part:
                start, end = at * page_size, min((at + count) * page_size, length)
                block = src[:, :, first : first + count].reshape(
                    src.shape[0], 2, count * page_size, src.shape[4], src.shape[5]
                )  # (layers, 2, tokens, kv_heads, head_dim), a view
                head_major = block[:, :, : end - start].transpose(0, 1, 3, 2, 4)
                np.copyto(dst[:, :, :, start:end], head_major)

        if length < _PARALLEL_MIN_TOKENS:
            copy(runs)
        else:
            first_half, second_half = _halves(runs, num_pages // 2)
            pending = _fill_helper.submit(copy, second_half)
            try:
                copy(first_half)
            finally:
                pending.result()  # SYNC: the workspace is complete before attention reads it
        self.length = length


class SpareWorkspaces:
    """Released workspaces, reused by the next sequences (at most `keep`, the largest)."""

    def __init__(self, pool: DevicePool, keep: int = SPARES) -> None:
        self.pool = pool
        self.keep = keep
        self._spares: list[Workspace] = []

    def take(self, tokens: int) -> Workspace:
        """An empty workspace for at least `tokens`: the smallest spare that fits, else new."""
        fitting = [w for w in self._spares if w.capacity >= tokens]
        if not fitting:
            return Workspace.for_tokens(self.pool, tokens)
        workspace = min(fitting, key=lambda w: w.capacity)
        self._spares.remove(workspace)
        workspace.length = 0
        return workspace

    def give(self, workspace: Workspace) -> None:
        self._spares.append(workspace)
        if len(self._spares) > self.keep:
            self._spares.remove(min(self._spares, key=lambda w: w.capacity))

    def __len__(self) -> int:
        return len(self._spares)


def _halves(
    runs: list[tuple[int, int, int]], cut: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """`runs` (pool start, workspace page, count) split at workspace page `cut`."""
    before, after = [], []
    for first, at, count in runs:
        if at + count <= cut:
            before.append((first, at, count))
        elif at >= cut:
            after.append((first, at, count))
        else:  # the run straddles the cut
            before.append((first, at, cut - at))
            after.append((first + cut - at, cut, at + count - cut))
    return before, after

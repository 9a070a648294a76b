"""A running sequence's contiguous KV on CPU, and its one-time fill from the paged pool.

The workspace is head-major, (layers, 2, kv_heads, capacity, head_dim): attention reads a
layer's keys for a kv head as one contiguous run of tokens, which batched matmuls take as they are
(the pool's token-major order made them copy a layer's keys and values on every step: 14 ms of a
35 ms decode step at 2.7k tokens, bf16, 2 cores). A run of pages consecutive in the pool moves in
with one strided block copy per layer and K/V (numpy releases the GIL: a long fill splits the
layers with one helper thread).

Running sequences take their workspaces from one `WorkspaceArena`: slots of a single tensor,
(slots, layers, 2, kv_heads, max_model_len, head_dim), reserved up front and touched only as
far as sequences grow, so a step's decodes attend in one call over a range of slots (see
`WorkspaceAttention`) and a slot's memory is reused without first-touch page faults. A sequence
that finds no free slot gets a workspace of its own; released ones are kept as spares
(`SpareWorkspaces`).
"""

from __future__ import annotations

import heapq
import math
import mmap
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np
import torch

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.transfer.page_rows import paired_runs

ROUNDING = 256  # tokens; workspaces grow in these steps at least, doubling beyond
_PARALLEL_MIN_TOKENS = 512  # below this one thread copies faster than two coordinate
SPARES = 2  # released workspaces kept for reuse (bounded memory: at most this many)
FILL_THREAD_PREFIX = "tkv-fill"


def fill_helper() -> ThreadPoolExecutor:
    """The one helper thread a fill splits its layers with (started on first use); its owner
    shuts it down."""
    return ThreadPoolExecutor(1, thread_name_prefix=FILL_THREAD_PREFIX)


def _numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as numpy integers of its element size (numpy has no bfloat16)."""
    view_dtype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(view_dtype).numpy()


class Workspace:
    """A running sequence's KV, contiguous: (layers, 2, kv_heads, capacity, head_dim); its own
    tensor, or `slot` of a `WorkspaceArena` (then its capacity is fixed)."""

    def __init__(self, pool: DevicePool, capacity: int) -> None:
        assert pool.device.type == "cpu", "workspaces are the CPU attention path"
        layout = pool.layout
        self.kv = torch.empty(
            (layout.num_layers, 2, layout.num_kv_heads, capacity, layout.head_dim),
            dtype=layout.dtype,
        )
        self.length = 0
        self.slot: int | None = None

    @classmethod
    def in_slot(cls, arena: WorkspaceArena, slot: int) -> Workspace:
        workspace = cls.__new__(cls)
        workspace.kv = arena.kv[slot]
        workspace.length = 0
        workspace.slot = slot
        return workspace

    @classmethod
    def for_tokens(cls, pool: DevicePool, tokens: int) -> Workspace:
        return cls(pool, -(-tokens // ROUNDING) * ROUNDING)

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def grow(self, needed: int) -> None:
        assert self.slot is None, f"an arena slot holds {self.capacity} tokens, {needed} asked"
        capacity = max(needed, 2 * self.capacity)
        capacity = -(-capacity // ROUNDING) * ROUNDING
        bigger = self.kv.new_empty((*self.kv.shape[:3], capacity, self.kv.shape[4]))
        bigger[:, :, :, : self.length] = self.kv[:, :, :, : self.length]
        self.kv = bigger

    def fill_from_pool(
        self, pool: DevicePool, page_ids: list[int], length: int, helper: Executor | None = None
    ) -> None:
        """Copy the first `length` tokens' KV from the pool pages `page_ids` (in order); a long
        fill copies half the layers on `helper` (see `fill_helper`), if given."""
        if length > self.capacity:
            self.grow(length)
        page_size = pool.layout.page_size
        num_pages = -(-length // page_size)
        # (pool start, workspace start page, count) per run consecutive in the pool
        runs = paired_runs(list(page_ids[:num_pages]), list(range(num_pages)))
        src = _numpy_view(pool.kv)  # (layers, 2, pool pages, page_size, kv_heads, head_dim)
        dst = _numpy_view(self.kv)  # (layers, 2, kv_heads, capacity, head_dim)

        def copy(layers: slice) -> None:
            for first, at, count in runs:
                start, end = at * page_size, min((at + count) * page_size, length)
                block = src[layers, :, first : first + count].reshape(
                    -1, 2, count * page_size, *src.shape[4:]
                )  # (layers, 2, tokens, kv_heads, head_dim), a view: the pages are consecutive
                tokens = block[:, :, : end - start].transpose(0, 1, 3, 2, 4)  # head-major
                np.copyto(dst[layers, :, :, start:end], tokens)

        if helper is None or length < _PARALLEL_MIN_TOKENS:
            copy(slice(None))
        else:
            half = src.shape[0] // 2
            pending = helper.submit(copy, slice(half, None))
            try:
                copy(slice(0, half))
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


class WorkspaceArena:
    """Workspaces as slots of one tensor, (slots, layers, 2, kv_heads, capacity, head_dim);
    the lowest free slot is taken first, so running sequences sit in a short range of slots."""

    def __init__(self, pool: DevicePool, slots: int, capacity: int) -> None:
        layout = pool.layout
        capacity = -(-capacity // ROUNDING) * ROUNDING
        shape = (slots, layout.num_layers, 2, layout.num_kv_heads, capacity, layout.head_dim)
        # An anonymous mapping, not torch.empty: it reads as zeros and is backed only where
        # sequences write. The batched decode masks each slot's keys past its end, but the
        # kernel still multiplies their values by 0, and 0 x NaN is NaN: recycled allocator
        # memory could hold NaN bit patterns; this holds zeros or a sequence's own K/V.
        element_bytes = torch.empty((), dtype=layout.dtype).element_size()
        self._mapping = mmap.mmap(-1, math.prod(shape) * element_bytes)
        self.kv = torch.frombuffer(self._mapping, dtype=layout.dtype).view(shape)
        self._free = list(range(slots))  # a heap: lowest slot first

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    def take(self, tokens: int) -> Workspace | None:
        if tokens > self.capacity or not self._free:
            return None
        return Workspace.in_slot(self, heapq.heappop(self._free))

    def give(self, workspace: Workspace) -> None:
        assert workspace.slot is not None
        heapq.heappush(self._free, workspace.slot)

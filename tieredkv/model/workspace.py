"""A running sequence's contiguous KV on CPU, and its one-time fill from the paged pool.

The workspace is head-major, (layers, 2, kv_heads, capacity, head_dim): attention reads a
layer's keys for a kv head as one contiguous run of tokens, which batched matmuls take as they are
(in the pool's token-major order they would copy a layer's keys and values on every step, a
large share of a decode step). A run of pages consecutive in the pool moves in
with one strided block copy per layer and K/V (numpy releases the GIL: a long fill splits the
layers with one helper thread).

Running sequences take their workspaces from one `WorkspaceArena`: slots of a single tensor,
(slots, layers, 2, kv_heads, max_model_len, head_dim), reserved up front and touched only as
far as sequences grow, so a step's decodes attend in one call over a range of slots (see
`WorkspaceAttention`) and a slot's memory is reused without first-touch page faults. A sequence
that finds no free slot gets a workspace of its own; released ones are kept as spares
(`SpareWorkspaces`).

A released slot remembers which pool pages its KV mirrors, with their allocation stamps
(`DevicePool.stamps`). A new sequence whose cached prefix starts with those pages, still held by
the same allocations, takes that slot and copies in only the rest: a chat's next turn finds its
history where the previous turn left it instead of copying tens of MB again.
A page reallocated since has a new stamp, and from there on the slot is filled from the pool.

Written slot memory stays resident after its sequence leaves, up to the arena's budget of tokens
(see tieredkv.model.workspace_budget); past it, released slots give theirs back
(`madvise(MADV_DONTNEED)`: it reads as zeros again and is faulted in on the next write).
"""

from __future__ import annotations

import functools
import heapq
import math
import mmap
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np
import torch

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.cache.transfer.layout_copy import Run, paired_runs
from tieredkv.model.workspace_budget import SlotBudget

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
        self.mirrors = PageMirror()

    @classmethod
    def in_slot(cls, arena: WorkspaceArena, slot: int, kept: PageMirror | None = None) -> Workspace:
        """Slot `slot`, holding the whole pages `kept` records (none: empty)."""
        workspace = cls.__new__(cls)
        workspace.kv = arena.kv[slot]
        workspace.mirrors = kept or PageMirror()
        workspace.length = len(workspace.mirrors) * arena.pool.layout.page_size
        workspace.slot = slot
        return workspace

    def roll_back(self, start: int, page_size: int) -> None:
        """Forget the tokens from `start` on, and those of its page before it (refilled from
        the pool, which may hold another page there now)."""
        self.length = start - start % page_size
        self.mirrors = self.mirrors.head(self.length // page_size)

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
        self,
        pool: DevicePool,
        page_ids: list[int],
        length: int,
        helper: Executor | None = None,
        landed: np.ndarray | None = None,
    ) -> None:
        """Copy the KV of tokens `self.length`..`length` from the pool pages `page_ids` (the
        sequence's pages, in order), except the pages `landed` marks (bool per page position:
        already here, see tieredkv.model.promotion_fill); a long fill copies half the layers
        on `helper` (see `fill_helper`), if given."""
        if length > self.capacity:
            self.grow(length)
        page_size = pool.layout.page_size
        begin = self.length
        positions = range(begin // page_size, -(-length // page_size))
        if landed is not None:
            positions = [p for p in positions if not (p < len(landed) and landed[p])]
        runs = paired_runs([page_ids[p] for p in positions], list(positions))
        copy = functools.partial(self._copy_runs, pool, runs, begin, length)
        if helper is None or length - begin < _PARALLEL_MIN_TOKENS:
            copy(slice(None))
        else:
            half = pool.layout.num_layers // 2
            pending = helper.submit(copy, slice(half, None))
            try:
                copy(slice(0, half))
            finally:
                pending.result()  # SYNC: the workspace is complete before attention reads it
        self.length = length

    def fill_pages(
        self, pool: DevicePool, page_ids: Sequence[int], positions: Sequence[int]
    ) -> None:
        """Copy whole pool pages `page_ids` to page positions `positions` (this thread, every
        layer); `length` is left as it is (the caller knows which positions hold what)."""
        page_size = pool.layout.page_size
        runs = paired_runs(list(page_ids), list(positions))
        end = (max(positions) + 1) * page_size if positions else 0
        self._copy_runs(pool, runs, 0, min(end, self.capacity), slice(None))

    def _copy_runs(
        self, pool: DevicePool, runs: list[Run], begin: int, length: int, layers: slice
    ) -> None:
        """Copy tokens begin..length of each run (pool start, workspace start page, count)
        from the pool, `layers` only: one strided block copy per run, layer and K/V."""
        page_size = pool.layout.page_size
        dst = _numpy_view(self.kv)  # (layers, 2, kv_heads, capacity, head_dim)
        for first, at, count in runs:
            start, end = max(at * page_size, begin), min((at + count) * page_size, length)
            if start >= end:
                continue
            run = _numpy_view(pool.layer_run(layers, first, count))
            block = run.reshape(
                -1, 2, count * page_size, *run.shape[4:]
            )  # (layers, 2, tokens, kv_heads, head_dim), a view where the pages are one run
            skip = start - at * page_size
            tokens = block[:, :, skip : end - at * page_size].transpose(0, 1, 3, 2, 4)
            np.copyto(dst[layers, :, :, start:end], tokens)  # head-major


class PageMirror:
    """For each page of a workspace's tokens, the pool page they were copied from or written
    to beside it, and that page's allocation stamp then (`DevicePool.stamps`). Recorded when
    the workspace first covers a page and never updated: a page the engine swaps afterwards (a
    duplicate freed for the tree's copy) stays recorded as the one the workspace matches."""

    def __init__(self, pages: np.ndarray | None = None, stamps: np.ndarray | None = None) -> None:
        self.pages = np.zeros(0, dtype=np.int64) if pages is None else pages
        self.stamps = np.zeros(0, dtype=np.int64) if stamps is None else stamps

    def __len__(self) -> int:
        return len(self.pages)

    def extend(self, pool: DevicePool, page_ids: Sequence[int], num_pages: int) -> None:
        """Record the sequence's pages up to `num_pages` that are not recorded yet."""
        have = len(self.pages)
        if num_pages > have:
            added = np.asarray(page_ids[have:num_pages], dtype=np.int64)
            self.pages = np.concatenate([self.pages, added])
            self.stamps = np.concatenate([self.stamps, pool.stamps[added]])

    def head(self, num_pages: int) -> PageMirror:
        return PageMirror(self.pages[:num_pages], self.stamps[:num_pages])

    def matching_pages(self, pool: DevicePool, prefix: np.ndarray) -> int:
        """How many of `prefix`'s first pages are this mirror's first pages, still held by the
        allocations that held them when recorded."""
        n = min(len(self.pages), len(prefix))
        same = (self.pages[:n] == prefix[:n]) & (self.stamps[:n] == pool.stamps[prefix[:n]])
        return n if bool(same.all()) else int(np.argmin(same))


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
        workspace.mirrors = PageMirror()
        return workspace

    def give(self, workspace: Workspace) -> None:
        self._spares.append(workspace)
        if len(self._spares) > self.keep:
            self._spares.remove(min(self._spares, key=lambda w: w.capacity))

    def __len__(self) -> int:
        return len(self._spares)

    @property
    def nbytes(self) -> int:
        return sum(w.kv.nbytes for w in self._spares)


class WorkspaceArena:
    """Workspaces as slots of one tensor, (slots, layers, 2, kv_heads, capacity, head_dim);
    the lowest free slot is taken first, so running sequences sit in a short range of slots.
    Released slots keep their written memory while the slots hold at most `budget_tokens`
    (default: all of them), and give it back beyond."""

    def __init__(
        self, pool: DevicePool, slots: int, capacity: int, budget_tokens: int | None = None
    ) -> None:
        layout = pool.layout
        capacity = -(-capacity // ROUNDING) * ROUNDING
        shape = (slots, layout.num_layers, 2, layout.num_kv_heads, capacity, layout.head_dim)
        # An anonymous mapping, not torch.empty: it reads as zeros and is backed only where
        # sequences write. The batched decode masks each slot's keys past its end, but the
        # kernel still multiplies their values by 0, and 0 x NaN is NaN: recycled allocator
        # memory could hold NaN bit patterns; this holds zeros or a sequence's own K/V.
        element_bytes = torch.empty((), dtype=layout.dtype).element_size()
        # Private, so that MADV_DONTNEED frees it (shared anonymous memory would stay).
        self._mapping = mmap.mmap(-1, math.prod(shape) * element_bytes, flags=mmap.MAP_PRIVATE)
        self.kv = torch.frombuffer(self._mapping, dtype=layout.dtype).view(shape)
        self.pool = pool
        self._free = list(range(slots))  # a heap: lowest slot first
        self._kept: dict[int, PageMirror] = {}  # free slots' full pages, as they were released
        self.reused_tokens = 0  # tokens taken over from released slots, not copied again
        # how far each slot's memory has been written (tokens): a first touch faults its
        # pages in one 4 KiB page at a time, slow on a VM, so written slots are preferred
        budget_tokens = slots * capacity if budget_tokens is None else budget_tokens
        self.budget = SlotBudget(slots, budget_tokens)

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    @property
    def nbytes(self) -> int:
        """Reserved address space: resident only as far as sequences have written."""
        return len(self._mapping)

    @property
    def resident_bytes(self) -> int:
        """The slots' written memory (tokens x bytes a token; resident to the 4 KiB page)."""
        return self.budget.resident_tokens * self.pool.layout.token_bytes

    def grow(self, slot: int, tokens: int) -> None:
        """Slot `slot`'s sequence writes its first `tokens` tokens."""
        self.budget.grow(slot, tokens)
        if self.budget.over_budget():
            self._give_back_memory()

    def take(
        self,
        tokens: int,
        prefix_pages: Sequence[int] = (),
        prefix_tokens: int = 0,
        spare_kept: bool = False,
    ) -> Workspace | None:
        """A slot for a sequence of `tokens` whose first `prefix_tokens` are cached in the pool
        pages `prefix_pages`: the free slot that still holds the most of that prefix, with its
        length set past what it holds; else the lowest free slot, empty. With `spare_kept`,
        else a free slot whose memory was written that far already if any (a first touch
        faults its pages in), and among those one that remembers no pages (those that do are
        kept for the chats they hold), then the lowest. None when none is free or `tokens` do
        not fit."""
        if tokens > self.capacity or not self._free:
            return None
        page_size = self.pool.layout.page_size
        best, best_pages = None, 0
        if prefix_tokens >= page_size and self._kept:
            prefix = np.asarray(prefix_pages[: prefix_tokens // page_size], dtype=np.int64)
            for slot, mirror in self._kept.items():
                pages = mirror.matching_pages(self.pool, prefix)
                if pages > best_pages:
                    best, best_pages = slot, pages
        if best is None and spare_kept:
            touched = self.budget.touched
            best = min(self._free, key=lambda s: (touched[s] < tokens, s in self._kept, s))
        if best is None:
            slot = heapq.heappop(self._free)
        else:
            slot = best
            self._free.remove(slot)
            heapq.heapify(self._free)
        kept = self._kept.pop(slot, None)
        self.reused_tokens += best_pages * page_size
        return Workspace.in_slot(self, slot, kept.head(best_pages) if best_pages else None)

    def give(self, workspace: Workspace) -> None:
        """A released slot: free again, remembering the pages whose whole KV it holds."""
        assert workspace.slot is not None
        self.budget.grow(workspace.slot, workspace.length)
        full = min(workspace.length // self.pool.layout.page_size, len(workspace.mirrors))
        if full:
            self._kept[workspace.slot] = workspace.mirrors.head(full)
        heapq.heappush(self._free, workspace.slot)
        self.budget.released(workspace.slot)
        if self.budget.over_budget():
            self._give_back_memory()

    def _give_back_memory(self) -> None:
        """Free slots' memory back to the system, until the slots are within budget."""
        slot_bytes = len(self._mapping) // len(self.budget.touched)  # 4 KiB pages (ROUNDING)
        for slot in self.budget.to_give_back(self._free, self._kept):
            self._mapping.madvise(mmap.MADV_DONTNEED, slot * slot_bytes, slot_bytes)
            self._kept.pop(slot, None)  # its pages read as zeros now
            self.budget.given_back(slot)

"""Page-by-page copies between CPU page tensors, through numpy views, without staging.

Every layout stores one page as `layers * 2` runs of `page_size * kv_heads * head_dim`
elements; only the axis that indexes pages differs:

  page-major  (host pool, staging)  (pages, layers * 2, run)   one page = one contiguous block
  layer-major (device pool on CPU)  (layers * 2, pages, run)   one page = layers * 2 strided runs

so any page moves between any two layouts with one strided `np.copyto`, and a run of pages that
is consecutive on both sides moves with one call. numpy releases the GIL for these copies, so
threads copy in parallel; the Python loop costs about a microsecond per run.

One thread cannot reach memcpy speed on the layer-major side's scattered runs, and two threads
overlap their cache misses, so a batch of at least `SPLIT_MIN_PAGES` pages is shared with one
helper thread (`copy_pages(..., helper=...)`; `benchmarks/tier_bandwidth.py` measures it).
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor

import numpy as np
import torch

# A batch this large is shared with a helper thread; below it, waking the helper costs more
# than it copies.
SPLIT_MIN_PAGES = 16
PART_PAGES = 4  # pages per claimed part: small enough that a late helper still balances

Run = tuple[int, int, int]  # (src first page, dst first page, pages)


def paired_runs(src: list[int], dst: list[int]) -> list[Run]:
    """(src start, dst start, length) of each maximal run where both src and dst go up by one."""
    assert len(src) == len(dst), f"{len(src)} source pages vs {len(dst)} destination pages"
    runs = []
    start = 0
    for index in range(1, len(src) + 1):
        if (
            index == len(src)
            or src[index] != src[index - 1] + 1
            or dst[index] != dst[index - 1] + 1
        ):
            runs.append((src[start], dst[start], index - start))
            start = index
    return runs


class PageRows:
    """A (pages, layers * 2, run) view of a CPU page tensor, in either layout, no copy.

    `page_axis` 0 is page-major (host pool, staging), 1 is layer-major (device pool).
    """

    def __init__(self, kv: torch.Tensor, page_axis: int) -> None:
        assert kv.device.type == "cpu" and kv.is_contiguous(), "a contiguous CPU tensor"
        assert page_axis in (0, 1) and kv.dim() == 6, f"page_axis={page_axis}, {kv.dim()} dims"
        self.layer_major_layout = page_axis == 1
        # 2-byte elements where the dtype allows: numpy's fast copy loops, any float format
        view_dtype = torch.int16 if kv.element_size() % 2 == 0 else torch.uint8
        flat = kv.view(view_dtype).numpy()
        run = flat.shape[3] * flat.shape[4] * flat.shape[5]  # page_size * heads * dim
        if page_axis == 0:  # (pages, layers, 2, page_size, heads, dim)
            self._array = flat.reshape(flat.shape[0], flat.shape[1] * 2, run)
        else:  # (layers, 2, pages, page_size, heads, dim) -> (pages, layers * 2, run)
            layer_major = flat.reshape(flat.shape[0] * 2, flat.shape[2], run)
            self._array = layer_major.transpose(1, 0, 2)

    @classmethod
    def page_major(cls, kv: torch.Tensor) -> PageRows:
        return cls(kv, 0)

    @classmethod
    def layer_major(cls, kv: torch.Tensor) -> PageRows:
        return cls(kv, 1)

    @property
    def num_pages(self) -> int:
        return self._array.shape[0]

    def span(self, first: int, count: int) -> np.ndarray:
        """Pages first .. first + count - 1: a (count, layers * 2, run) view."""
        return self._array[first : first + count]

    def read(self, first: int, count: int) -> np.ndarray:
        """Pages first .. first + count - 1 as (count, layers * 2, run) rows to copy from."""
        return self._array[first : first + count]

    def write(self, first: int, rows: np.ndarray) -> None:
        """Pages first .. first + len(rows) - 1 <- `rows` (count, layers * 2, run)."""
        np.copyto(self._array[first : first + len(rows)], rows)

    def put(self, page: int, data: memoryview) -> None:
        """Page `page` <- one page's bytes in page-major order (a store's record payload)."""
        row = self._array[page]
        np.copyto(row, np.frombuffer(data, dtype=row.dtype).reshape(row.shape))


def copy_threads(num_pages: int, helper: Executor | None) -> int:
    """How many threads `copy_pages` uses for a batch of `num_pages` pages."""
    return 2 if helper is not None and num_pages >= SPLIT_MIN_PAGES else 1


def copy_pages(
    dst: PageRows,
    dst_pages: list[int],
    src: PageRows,
    src_pages: list[int],
    helper: Executor | None = None,
) -> None:
    """dst page dst_pages[i] <- src page src_pages[i] for every i (dst pages distinct).

    Runs go in address order of the layer-major side, whose strided runs are the slow ones.
    With a `helper`
    executor and `copy_threads(...) == 2`, the caller and one helper task claim parts of
    `PART_PAGES` pages in turn; returns once every part is copied. A helper task that has not
    started when the caller runs out of parts is cancelled, so a busy pool never delays the copy.
    """
    runs = paired_runs(src_pages, dst_pages)
    runs.sort(key=lambda run: run[0] if src.layer_major_layout else run[1])
    if copy_threads(len(src_pages), helper) == 1:
        _copy_runs(dst, src, runs)
        return
    assert helper is not None
    parts = _PartQueue(_split(runs, PART_PAGES))

    def drain() -> None:
        while (part := parts.take()) is not None:
            _copy_runs(dst, src, part)

    helping = helper.submit(drain)
    try:
        drain()
    finally:
        if not helping.cancel():
            helping.result()  # SYNC: the helper's last part is in place (or its error raised)


def _copy_runs(dst: PageRows, src: PageRows, runs: list[Run]) -> None:
    for src_first, dst_first, count in runs:
        dst.write(dst_first, src.read(src_first, count))


def _split(runs: list[Run], part_pages: int) -> list[list[Run]]:
    """The runs, in order, cut into parts of `part_pages` pages (the last may be smaller)."""
    parts: list[list[Run]] = [[]]
    room = part_pages
    for src_first, dst_first, count in runs:
        done = 0
        while done < count:
            if room == 0:
                parts.append([])
                room = part_pages
            take = min(room, count - done)
            parts[-1].append((src_first + done, dst_first + done, take))
            done += take
            room -= take
    return parts


class _PartQueue:
    """Parts handed out once each, to whichever thread asks first."""

    def __init__(self, parts: list[list[Run]]) -> None:
        self._parts = parts
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> list[Run] | None:
        with self._lock:
            index = self._next
            self._next += 1
        return self._parts[index] if index < len(self._parts) else None

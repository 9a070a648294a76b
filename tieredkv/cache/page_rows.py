"""Page-by-page copies between CPU page tensors, through numpy views, without staging.

Every layout stores one page as `layers * 2` runs of `page_size * kv_heads * head_dim`
elements; only the axis that indexes pages differs:

  page-major  (host pool, staging)  (pages, layers * 2, run)   one page = one contiguous block
  layer-major (device pool on CPU)  (layers * 2, pages, run)   one page = layers * 2 strided runs

so any page moves between any two layouts with one strided `np.copyto`, and a run of pages that
is consecutive on both sides moves with one call. numpy releases the GIL for these copies, so
mover workers copy in parallel; the Python loop costs about a microsecond per run.
"""

from __future__ import annotations

import numpy as np
import torch


def paired_runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
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


def copy_pages(dst: PageRows, dst_pages: list[int], src: PageRows, src_pages: list[int]) -> None:
    """dst page dst_pages[i] <- src page src_pages[i] for every i (dst pages distinct).

    Runs go in address order of the layer-major side, whose strided runs are the slow ones
    (measured: about 15% faster than the given order for shuffled pages)."""
    runs = paired_runs(src_pages, dst_pages)
    runs.sort(key=lambda run: run[0] if src.layer_major_layout else run[1])
    for src_first, dst_first, count in runs:
        np.copyto(dst.span(dst_first, count), src.span(src_first, count))

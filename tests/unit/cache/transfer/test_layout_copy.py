"""copy_pages shared with a helper thread: every byte lands whoever copies which part, a busy
helper pool never holds a copy up, and runs are cut into parts in address order."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.transfer.layout_copy import (
    SPLIT_MIN_PAGES,
    PageRows,
    _split,
    copy_pages,
    copy_threads,
)

LAYOUT = PageLayout(num_layers=2, num_kv_heads=1, head_dim=8, page_size=4, dtype=torch.bfloat16)
NUM_PAGES = 40


class InlineExecutor(Executor):
    """Runs a task at once on the submitting thread: the helper copies every part first."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Future:
        self.submitted += 1
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class RecordingExecutor(Executor):
    """Submits to `pool` and keeps the futures, to see what became of each task."""

    def __init__(self, pool: Executor) -> None:
        self.pool = pool
        self.futures: list[Future] = []

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Future:
        future = self.pool.submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def _pools(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(device (layers, 2, pages, ...), host (pages, layers, 2, ...)) of random bits."""
    generator = torch.Generator().manual_seed(seed)
    device = torch.empty((2, 2, NUM_PAGES, 4, 1, 8), dtype=torch.bfloat16)
    host = torch.empty((NUM_PAGES, 2, 2, 4, 1, 8), dtype=torch.bfloat16)
    device.view(torch.int16).random_(generator=generator)
    host.view(torch.int16).random_(generator=generator)
    return device, host


def _round_trip(helper: Executor) -> None:
    """Host -> device then device -> host for SPLIT_MIN_PAGES + 5 shuffled pages (runs of 1 to
    6, cut across parts), bytes checked."""
    device, host = _pools(seed=1)
    rng = random.Random(2)
    device_pages = [0, 1, 2, 3, 9, 10, 20, 5, 6, 7, 15, 14, 13, 30, 31, 32, 33, 34, 35, 25, 22]
    device_pages = device_pages[: SPLIT_MIN_PAGES + 5]
    host_pages = rng.sample(range(NUM_PAGES), len(device_pages))
    device_rows, host_rows = PageRows.layer_major(device), PageRows.page_major(host)
    untouched = [p for p in range(NUM_PAGES) if p not in device_pages]
    device_before = device[:, :, untouched].clone()

    copy_pages(device_rows, device_pages, host_rows, host_pages, helper)
    for h, d in zip(host_pages, device_pages, strict=True):
        assert torch.equal(device[:, :, d].view(torch.int16), host[h].view(torch.int16))
    assert torch.equal(device[:, :, untouched].view(torch.int16), device_before.view(torch.int16))

    device.view(torch.int16).random_(generator=torch.Generator().manual_seed(3))
    host_before = host.clone()
    copy_pages(host_rows, host_pages, device_rows, device_pages, helper)
    for h, d in zip(host_pages, device_pages, strict=True):
        assert torch.equal(host[h].view(torch.int16), device[:, :, d].view(torch.int16))
    for page in set(range(NUM_PAGES)) - set(host_pages):
        assert torch.equal(host[page].view(torch.int16), host_before[page].view(torch.int16))


def test_a_shared_copy_moves_every_byte_on_a_real_pool() -> None:
    with ThreadPoolExecutor(2) as pool:
        helper = RecordingExecutor(pool)
        _round_trip(helper)
    assert len(helper.futures) == 2  # one helper task per copy
    assert all(f.cancelled() or f.exception() is None for f in helper.futures)


def test_a_helper_that_takes_every_part_first_leaves_the_copy_complete() -> None:
    helper = InlineExecutor()
    _round_trip(helper)
    assert helper.submitted == 2


def test_a_busy_helper_pool_is_cancelled_and_the_caller_copies_everything() -> None:
    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(release.wait)  # the pool's only thread is busy until the end
        helper = RecordingExecutor(pool)
        try:
            _round_trip(helper)
        finally:
            release.set()
    assert len(helper.futures) == 2 and all(f.cancelled() for f in helper.futures)


def test_only_batches_of_split_min_pages_use_the_helper() -> None:
    pool = InlineExecutor()
    assert copy_threads(SPLIT_MIN_PAGES - 1, pool) == 1
    assert copy_threads(SPLIT_MIN_PAGES, pool) == 2
    assert copy_threads(10 * SPLIT_MIN_PAGES, None) == 1
    device, host = _pools(seed=4)
    pages = list(range(SPLIT_MIN_PAGES - 1))
    copy_pages(PageRows.layer_major(device), pages, PageRows.page_major(host), pages, pool)
    assert pool.submitted == 0
    assert torch.equal(device[:, :, 0].view(torch.int16), host[0].view(torch.int16))


@pytest.mark.parametrize(
    ("runs", "part_pages", "parts"),
    [
        (
            [(0, 10, 3), (5, 2, 6)],
            4,
            [[(0, 10, 3), (5, 2, 1)], [(6, 3, 4)], [(10, 7, 1)]],
        ),
        ([(7, 1, 1)] * 3, 2, [[(7, 1, 1), (7, 1, 1)], [(7, 1, 1)]]),
        ([(0, 0, 8)], 4, [[(0, 0, 4)], [(4, 4, 4)]]),
    ],
)
def test_runs_are_cut_into_parts_in_order(
    runs: list[tuple[int, int, int]], part_pages: int, parts: list
) -> None:
    assert _split(runs, part_pages) == parts

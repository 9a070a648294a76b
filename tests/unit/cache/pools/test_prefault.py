"""Faulting in the host pool ahead of use: pages become resident (the kernel's own mincore says
so) and contents written before stay as they were."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import numpy as np
import pytest
import torch

from tests.support.tiny_cache import tiny_layout
from tieredkv.cache.page_layout import aligned_empty
from tieredkv.cache.pools import host_pool
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.cache.pools.prefault import Prefaulter, populate_write

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")


def resident_pages(buffer: np.ndarray) -> int:
    """How many of `buffer`'s pages are in memory (mincore(2))."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    pages = -(-buffer.nbytes // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert libc.mincore(buffer.ctypes.data, buffer.nbytes, vec) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vec)


def test_populate_write_makes_pages_resident_and_keeps_contents() -> None:
    buffer = aligned_empty(64 * mmap.PAGESIZE)
    buffer[5 * mmap.PAGESIZE : 5 * mmap.PAGESIZE + 8] = np.arange(8, dtype=np.uint8)
    assert resident_pages(buffer) == 1  # only the page written
    if not populate_write(buffer.ctypes.data, buffer.nbytes):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert resident_pages(buffer) == 64
    assert buffer[5 * mmap.PAGESIZE : 5 * mmap.PAGESIZE + 8].tolist() == list(range(8))
    assert not buffer[: 5 * mmap.PAGESIZE].any()


def test_host_pool_prefaults_in_chunks_keeping_pages_in_use() -> None:
    layout = tiny_layout()
    pool = HostPool.from_bytes(layout, 256 * layout.page_bytes)
    raw = pool.kv.view(torch.uint8).reshape(-1).numpy()
    pages = -(-raw.nbytes // mmap.PAGESIZE)
    assert resident_pages(raw) == 0  # nothing touched yet
    [page] = pool.alloc(1)
    pool.kv[page] = torch.arange(pool.kv[page].numel()).view(pool.kv[page].shape).to(layout.dtype)
    before = pool.kv[page].clone()
    prefaulter = pool.prefaulter
    assert prefaulter is not None
    prefaulter.chunk_bytes = raw.nbytes // 4
    steps = 0
    while pool.prefault_some():
        steps += 1
    if prefaulter.unsupported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert steps == 3 and prefaulter.done  # four chunks: True after each of the first three
    assert prefaulter.faulted == raw.nbytes and resident_pages(raw) == pages
    assert torch.equal(pool.kv[page], before)  # a page in use kept its contents
    others = [p for p in range(pool.num_pages) if p != page]
    assert not pool.kv[others].view(torch.uint8).any()  # the rest still zero
    assert not pool.prefault_some()


def test_prefaulting_starts_where_pages_are_handed_out_first() -> None:
    buffer = aligned_empty(16 * mmap.PAGESIZE)
    prefaulter = Prefaulter(buffer, chunk_bytes=4 * mmap.PAGESIZE)
    assert prefaulter.step() or prefaulter.unsupported
    if prefaulter.unsupported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    vec_pages = resident_pages(buffer[: 4 * mmap.PAGESIZE])
    assert vec_pages == 4 and resident_pages(buffer) == 4  # the first chunk, nothing else


def test_host_pool_prefaults_a_window_ahead_of_the_pages_handed_out(monkeypatch) -> None:
    layout = tiny_layout()
    pages_per_os_page = max(1, mmap.PAGESIZE // layout.page_bytes)
    window = 8 * mmap.PAGESIZE
    monkeypatch.setattr(host_pool, "PREFAULT_AHEAD_BYTES", window)
    pool = HostPool.from_bytes(layout, 64 * pages_per_os_page * layout.page_bytes + 123)
    prefaulter = pool.prefaulter
    assert prefaulter is not None
    prefaulter.chunk_bytes = 3 * mmap.PAGESIZE
    while pool.prefault_some():
        pass
    if prefaulter.unsupported:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert prefaulter.faulted == window  # the window ahead of nothing handed out yet
    pool.alloc(5 * pages_per_os_page + 1)  # pages 0..: the frontier moves past 5 OS pages
    while pool.prefault_some():
        pass
    handed_out_bytes = (5 * pages_per_os_page + 1) * layout.page_bytes
    wanted = -(-(handed_out_bytes + window) // mmap.PAGESIZE) * mmap.PAGESIZE
    assert prefaulter.faulted == wanted and not prefaulter.unsupported
    raw = pool.kv.view(torch.uint8).reshape(-1).numpy()
    assert resident_pages(raw) == wanted // mmap.PAGESIZE

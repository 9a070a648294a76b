"""Faulting in pool memory ahead of use, without writing it.

An anonymous mapping gets its memory page by page, on first write. On a VM that reports free
memory to its host (`page_reporting`), a first write costs far more than a write into memory
already mapped, so a write-through into fresh host pages is slow and the request after it pays
for it. So the host pool is faulted in ahead of use. Doing all of it before serving would delay
the start by seconds per GiB; a thread of its own at low priority makes requests slower, not
faster (it holds the memory map's lock while descheduled, and every other thread's faults and
mappings wait). So the engine thread does it, a short chunk at a time, only when it has nothing
else to do (`Prefaulter`): a request that arrives waits for one chunk at most. It keeps a window
ahead of the pages in use, not the whole pool: an idle server would otherwise spend CPU on
memory it may not need for hours (and a test suite full of idle servers, minutes).
`MADV_POPULATE_WRITE` (Linux 5.14) maps the pages writable as a write would, without the
writes, so it is safe while transfer threads copy into pages already in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module names it from 3.13 only
# what a request that arrives meanwhile may wait for: small enough that the wait is short
# beside a request's own time, large enough that the calls' overhead stays small
CHUNK_BYTES = 256 << 10


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return None
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def populate_write(address: int, length: int) -> bool:
    """Fault in [address, address + length) (page-aligned) for writing, contents unchanged;
    the call releases the GIL. False where the kernel or platform cannot (then each page
    faults on its first write, as without this)."""
    madvise = _madvise()
    if madvise is None or length <= 0:
        return False
    if madvise(address, length, MADV_POPULATE_WRITE) == 0:
        return True
    log.info("MADV_POPULATE_WRITE failed (errno %d): pages fault on first use", ctypes.get_errno())
    return False


class Prefaulter:
    """Faults in one page-aligned buffer a chunk at a time (`step`), from its start: pools hand
    out their lowest free pages first, so the faulted part is the part used next. Holds
    `buffer` until done, so its mapping outlives the calls."""

    def __init__(self, buffer: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.length = buffer.nbytes
        self.chunk_bytes = chunk_bytes
        self.faulted = 0
        self.unsupported = False  # the platform could not: pages fault on first use instead
        self._buffer: np.ndarray | None = buffer

    @property
    def done(self) -> bool:
        return self._buffer is None

    def step(self, up_to: int | None = None) -> bool:
        """Fault in the next chunk, not past byte `up_to` (default: the end); True while more
        remains below it."""
        if up_to is None:
            end = self.length
        else:  # madvise wants page-aligned addresses: whole pages only
            end = min(-(-up_to // mmap.PAGESIZE) * mmap.PAGESIZE, self.length)
        if self._buffer is None or self.faulted >= end:
            return False
        size = min(self.chunk_bytes, end - self.faulted)
        if populate_write(self._buffer.ctypes.data + self.faulted, size):
            self.faulted += size
        else:
            self.unsupported = True
        if self.unsupported or self.faulted >= self.length:
            self._buffer = None
        return self._buffer is not None and self.faulted < end

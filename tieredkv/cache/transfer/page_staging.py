"""Reusable staging buffers for copy jobs, one set per transfer thread.

A job runs start to finish on one worker thread, so a thread-local buffer is never used by two
jobs at once. Host staging is page-aligned (O_DIRECT moves it without a bounce copy) and
pre-touched, or pinned when the host pool is pinned (CUDA), so the copy to or from the device is
asynchronous. An asynchronous device copy that reads or writes the pinned buffer is fenced
(`fence`): the next job on the thread waits for it before touching the buffer again.
"""

from __future__ import annotations

import threading

import torch

from tieredkv.cache.page_layout import PageLayout, aligned_empty

# Host slots per thread: two for double buffering, a third for a streamed store read's third
# chunk in flight (see TransferJobs._from_store)
HOST_SLOTS = 3


class StagingBuffers:
    """Thread-local, grow-only page-major buffers: `host(n, slot)` on the CPU (HOST_SLOTS),
    `device_buffer(n)` on the device pool's device (CUDA only)."""

    def __init__(self, layout: PageLayout, pinned: bool, device: torch.device) -> None:
        self.layout = layout
        self.pinned = pinned
        self.device = device
        self._local = threading.local()

    def host(self, count: int, slot: int = 0) -> torch.Tensor:
        """(count, *page_shape) CPU staging `slot` (0 .. HOST_SLOTS - 1) of this thread; its
        old contents are garbage."""
        assert 0 <= slot < HOST_SLOTS, f"staging slot {slot} of {HOST_SLOTS}"
        fences: dict[int, torch.cuda.Event] = self._state("fences")
        fence = fences.pop(slot, None)
        if fence is not None:
            fence.synchronize()  # SYNC: the last async copy from/to this buffer has landed
        buffers: dict[int, torch.Tensor] = self._state("host")
        buffer = buffers.get(slot)
        if buffer is None or buffer.shape[0] < count:
            buffer = buffers[slot] = self._new_host(count)
        return buffer[:count]

    def prefault(self, count: int) -> None:
        """Give this thread every host slot of `count` pages now (an I/O worker at start): a
        first touch inside a request's copy costs its page faults there, and in a VM that
        returns freed memory to its host those are slow."""
        for slot in range(HOST_SLOTS):
            self.host(count, slot)

    def device_buffer(self, count: int) -> torch.Tensor:
        """(count, *page_shape) device staging of this thread. Stream-ordered reuse: a thread
        always queues on the same stream, so a later job's writes follow earlier reads."""
        buffer: torch.Tensor | None = getattr(self._local, "device", None)
        if buffer is None or buffer.shape[0] < count:
            shape = (count, *self.layout.page_shape)
            buffer = torch.empty(shape, dtype=self.layout.dtype, device=self.device)
            self._local.device = buffer
        return buffer[:count]

    def fence(self, slot: int) -> None:
        """Call after queueing an asynchronous copy that reads or writes `host(_, slot)`."""
        if self.device.type == "cuda":
            self._state("fences")[slot] = torch.cuda.current_stream(self.device).record_event()

    def _state(self, name: str) -> dict:
        state = getattr(self._local, name, None)
        if state is None:
            state = {}
            setattr(self._local, name, state)
        return state

    def _new_host(self, count: int) -> torch.Tensor:
        shape = (count, *self.layout.page_shape)
        if self.pinned:
            return torch.empty(shape, dtype=self.layout.dtype, pin_memory=True)
        raw = aligned_empty(count * self.layout.page_bytes)
        raw.fill(0)  # fault the pages in now, not inside a timed copy
        return torch.from_numpy(raw).view(self.layout.dtype).view(shape)

"""Executors run copy jobs off the engine thread and report each outcome once.

- `ThreadTransferExecutor`: a worker pool (CPU memory copies, disk I/O; positional I/O and torch
  copies release the GIL).
- `CudaStreamTransferExecutor`: a worker pool whose threads copy on dedicated CUDA streams,
  ordered after the work the engine had queued when the transfer was submitted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Protocol

import torch

TransferJob = Callable[[], list[bool]]  # copies the bytes; per page: arrived intact
Report = Callable[[list[bool] | None, BaseException | None], None]  # (page_ok, error)


class TransferExecutor(Protocol):
    """Runs `job` off the engine thread and calls `report` once with its outcome. `ticket` is
    the transfer the job belongs to: executors only hold it (a test's executor hands it back)."""

    def submit(self, ticket: Any, job: TransferJob, report: Report) -> None: ...

    def shutdown(self) -> None: ...


def _run(job: TransferJob, report: Report) -> None:
    try:
        page_ok = job()
    except Exception as error:  # an I/O error becomes a failed ticket, never a dead worker
        report(None, error)
    else:
        report(page_ok, None)


class ThreadTransferExecutor:
    """Runs each job on a pool of `num_workers` threads."""

    def __init__(self, num_workers: int, name: str, warm: Callable[[], None] | None = None) -> None:
        """`warm`: run once on each worker, all started now rather than on demand (a worker's
        thread-local staging is then ready before the first request needs it)."""
        self._pool = ThreadPoolExecutor(
            max_workers=num_workers, thread_name_prefix=name, initializer=warm
        )
        if warm is not None:
            started = threading.Barrier(num_workers)
            # every worker blocks until all exist: the pool must start one thread per task
            wait([self._pool.submit(started.wait) for _ in range(num_workers)])

    def submit(self, ticket: Any, job: TransferJob, report: Report) -> None:
        self._pool.submit(_run, job, report)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class CudaStreamTransferExecutor:
    """Worker threads that each copy on their own CUDA stream.

    The stream first waits for an event recorded on the submitting thread's current stream, so
    a demotion never reads a page before the kernels that wrote it finished; the worker then
    waits for its stream, so a reported ticket's bytes are in place.
    """

    def __init__(self, num_workers: int, device: torch.device) -> None:
        self._device = device
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="tkv-cuda")
        self._local = threading.local()

    def _stream(self) -> torch.cuda.Stream:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = torch.cuda.Stream(device=self._device)
            self._local.stream = stream
        return stream

    def submit(self, ticket: Any, job: TransferJob, report: Report) -> None:
        ready = torch.cuda.current_stream(self._device).record_event()
        self._pool.submit(self._run_on_stream, job, report, ready)

    def _run_on_stream(self, job: TransferJob, report: Report, ready: torch.cuda.Event) -> None:
        stream = self._stream()
        stream.wait_event(ready)
        with torch.cuda.stream(stream):
            try:
                page_ok = job()
                # SYNC: the copy worker waits for its own stream before reporting the ticket.
                stream.synchronize()
            except Exception as error:
                report(None, error)
                return
        report(page_ok, None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

"""Overlapping a transfer's checksums with its I/O.

A run of records moves as chunks. For each chunk, `before` (encode and checksum, for a write)
runs on the calling disk worker, `io` runs on one of the store's I/O threads, and `after`
(verify, for a read) runs back on the caller, in chunk order. While the caller works on one
chunk, up to `depth` other chunks' I/O is in flight, so a transfer costs about
max(I/O, checksums) instead of their sum. `os.preadv`/`os.pwrite` and xxhash's streaming
update all release the GIL, so the overlap is real.

    caller:  before(0) before(1)          before(2)          ...
    I/O:               io(0) ─────────────io(1) ─────────────io(2)
    caller:                     after(0)           after(1)  ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any


class ChunkPipeline:
    """I/O threads of the store (one pipeline for its reads, one for its writes).
    Thread-safe: any number of disk workers may `run` at once."""

    def __init__(self, io_threads: int, depth: int, name: str = "tieredkv-disk-io") -> None:
        assert io_threads >= 1 and depth >= 1, f"io_threads={io_threads}, depth={depth}"
        self.depth = depth
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix=name)

    def run(
        self,
        chunks: list[tuple[int, int]],
        before: Callable[[int, int], Any],
        io: Callable[[int, int, Any], Any],
        after: Callable[[int, int, Any, Any], Any],
    ) -> list[Any]:
        """For each (start, end) chunk: prepared = before(start, end) here; done = io(start,
        end, prepared) on an I/O thread; after(start, end, prepared, done) here, in order.
        Returns the `after` results in chunk order. On any error, waits for every chunk
        already submitted before raising the first error, so no I/O outlives the call."""
        results: list[Any] = []
        pending: deque[tuple[int, int, Any, Future]] = deque()
        try:
            for start, end in chunks:
                prepared = before(start, end)
                pending.append((start, end, prepared, self._pool.submit(io, start, end, prepared)))
                while len(pending) > self.depth:
                    results.append(self._finish(pending.popleft(), after))
            while pending:
                results.append(self._finish(pending.popleft(), after))
        except BaseException:
            wait([future for *_, future in pending])  # SYNC: let in-flight chunks land
            raise
        return results

    @staticmethod
    def _finish(item: tuple[int, int, Any, Future], after: Callable) -> Any:
        start, end, prepared, future = item
        return after(start, end, prepared, future.result())  # SYNC: this chunk's I/O

    def close(self) -> None:
        self._pool.shutdown(wait=True)

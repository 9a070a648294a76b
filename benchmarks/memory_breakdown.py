"""Resident memory of a process tree by kind of mapping, read from `/proc/PID/smaps`.

The kinds, as a Linux server built on torch lays its memory out:

- `heap` (`[heap]`): the allocator's heap, tcmalloc's or glibc's main arena: tensors (the
  weights, the device tier, activations) and Python's objects;
- `shared_anonymous` (`/dev/zero (deleted)`): shared anonymous memory, the host tier's buffer;
- `anonymous` (no path, stacks): private anonymous mappings, the attention workspace, large
  allocations mapped on their own, thread stacks, glibc's other arenas;
- `libraries` (`*.so*`): code and data of the shared libraries (torch, Python extensions);
- `files` (any other path): other mapped files.

`MemorySampler` samples the tree while it runs and keeps the breakdown of the moment its total
was highest.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from benchmarks.vllm_compare.peers import with_descendants

KINDS = ("heap", "shared_anonymous", "anonymous", "libraries", "files")
SAMPLE_INTERVAL_S = 0.5


def _kind(path: str) -> str | None:
    if path == "[heap]":
        return "heap"
    if path.startswith("/dev/zero"):
        return "shared_anonymous"
    if not path or path == "[stack]" or path.startswith("[anon"):
        return "anonymous"
    if path.startswith("["):  # [vdso], [vvar]: the kernel's
        return None
    return "libraries" if ".so" in Path(path).name else "files"


def breakdown(pid: int) -> dict[str, int]:
    """Resident bytes of `pid` by kind (KINDS); {} when the process is gone."""
    totals: Counter[str] = Counter({kind: 0 for kind in KINDS})
    kind = None
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                field, _, rest = line.partition(" ")
                if not field.endswith(":"):  # a mapping's header: range perms offset dev inode path
                    parts = line.split(maxsplit=5)
                    kind = _kind(parts[5].strip() if len(parts) > 5 else "")
                elif field == "Rss:" and kind is not None:
                    totals[kind] += int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return dict(totals)


def tree_breakdown(pid: int) -> dict[str, int]:
    """`breakdown` summed over `pid` and its descendants."""
    totals: Counter[str] = Counter({kind: 0 for kind in KINDS})
    for member in with_descendants([pid]):
        totals.update(breakdown(member))
    return dict(totals)


class MemorySampler:
    """`with MemorySampler(pid) as sampler: ...`; then `sampler.peak`: the tree's breakdown at the
    sample whose total was highest (a thread samples every SAMPLE_INTERVAL_S)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: dict[str, int] = {kind: 0 for kind in KINDS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _take(self) -> None:
        sample = tree_breakdown(self.pid)
        if sum(sample.values()) > sum(self.peak.values()):
            self.peak = sample

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._take()

    def __enter__(self) -> MemorySampler:
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

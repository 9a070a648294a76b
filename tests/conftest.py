"""Shared test settings: keep torch deterministic and, under pytest-xdist, each worker (with the
servers it starts) to its share of the machine's cores; run the files that start servers first.
"""

import os

import pytest
import torch

torch.manual_seed(0)


def threads_per_worker() -> int:
    """The cores this process may use, shared among the run's xdist workers (1 without xdist).

    Two workers on two cores each running two OpenMP threads (and each server they start
    another two) oversubscribe the machine: spinning OpenMP threads then cost more than the
    second thread gains."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers)


THREADS = threads_per_worker()
torch.set_num_threads(THREADS)
# the servers and benchmarks a test starts inherit it (unless the caller set it)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

# Files under these directories start servers or run benchmarks end to end (seconds to a
# minute each): scheduled first, so the many short unit files fill the end of a parallel run
# instead of one long file running alone while the other worker idles.
LONG_FILES_FIRST = (
    "tests/integration/",
    "tests/reliability/",
    "tests/unit/bench/",
    "tests/benchmarks/",
    "tests/property/",
)


def _schedule_rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next(
        (rank for rank, prefix in enumerate(LONG_FILES_FIRST) if path.startswith(prefix)),
        len(LONG_FILES_FIRST),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_schedule_rank)  # stable: a file's tests stay together and in order

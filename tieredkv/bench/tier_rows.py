"""The rows of `tieredkv bench tiers`: one measured path beside the limit it is judged against,
and the host<->device rows, measured through the transfer queue's copy jobs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from tieredkv.bench.tier_copies import memory_gbps
from tieredkv.bench.tier_limits import Rate
from tieredkv.cache.transfer.transfer_jobs import TransferJobs

DISK_TARGET = 0.80  # of the raw O_DIRECT bandwidth in the same direction
MEMORY_TARGET = 0.70  # of numpy memcpy on as many threads as the copy ran on
MOVER = "TransferJobs job (transfer_queue)"


@dataclass(frozen=True)
class BandwidthRow:
    """One measured path beside the limit it is judged against."""

    path: str  # "host->device", "disk->host", ...
    via: str  # the code path measured
    batch_pages: int
    rate: Rate  # the median repetition's GB/s, with the slowest's and the fastest's
    limit: str  # "memcpy 1 thread(s)", "raw disk write", "raw disk read"
    limit_gbps: float
    target: float  # the share of the limit asked for
    verified: bool  # the bytes arrived intact
    threads: int | None = None  # host<->device rows: threads the copy ran on

    @property
    def share(self) -> float:
        return self.rate.gbps / self.limit_gbps

    def to_json(self) -> dict[str, object]:
        fields = asdict(self)
        rate = fields.pop("rate")
        return {**fields, "gbps": rate["gbps"], "gbps_min": rate["min_gbps"],
                "gbps_max": rate["max_gbps"], "share": self.share,
                "meets_target": self.share >= self.target}  # fmt: skip


def memory_rows(
    transfer_jobs: TransferJobs, batches: list[int], reps: int, seed: int, memcpy: dict[int, float]
) -> list[BandwidthRow]:
    """host<->device through the transfer queue's jobs as the server runs them, each judged against
    memcpy on as many threads as it copied on (`memcpy`: {threads: GB/s})."""
    rng = np.random.default_rng(seed + 1)
    rows = []
    for batch in batches:
        to_device, to_host, ok = memory_gbps(transfer_jobs, batch, reps, rng)
        threads = transfer_jobs.memory_copy_threads(batch)
        limit = f"memcpy {threads} thread(s)"
        for path, rate in (("host->device", to_device), ("device->host", to_host)):
            row = BandwidthRow(path, MOVER, batch, rate, limit, memcpy[threads], MEMORY_TARGET, ok)
            rows.append(replace(row, threads=threads))
    return rows

"""Where a transfer job's time goes, stage by stage, beside cheaper ways to move the same pages
(measured in the same run, same pages, same pools), as GB/s and as a share of memcpy.

    .venv/bin/python benchmarks/tier_breakdown.py [--dir DIR] [--batch 1024] [--reps 5]
                                                  [--memory-only] [--json PATH]

Stages of today's jobs (tieredkv/cache/transfer/transfer_jobs.py):
  staging     torch.empty + index_select of the host pages (a fresh allocation per job: page
              faults) vs the same index_select into a reused, already-faulted buffer
  scatter     kernels.scatter_pages (index_copy_ of the permuted staging into the device pool)
  gather      kernels.gather_pages (index_select + permute + contiguous: two copies)
  host write  host.index_copy_ of a staging tensor into the host pages
  disk        write_pages / read_pages from an aligned reused buffer (no bounce copy) vs a
              fresh torch.empty (unaligned: the store's bounce copy, plus page faults)
Alternatives: one numpy copy per page between the two pools (no staging at all), and the job's
own page-by-page copy held to one thread (a job of SPLIT_MIN_PAGES pages or more shares it with
a helper thread). The disk store alone: write_pages / read_pages of random pages from aligned
memory over the whole store, each batch split over 1 and over 2 callers, read back verified.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from tieredkv.bench.disk_check import drop_file
from tieredkv.bench.tier_copies import make_transfer_jobs
from tieredkv.bench.tier_limits import Rate, median_seconds, memcpy_gbps
from tieredkv.bench.tier_store import LAYOUT, REP_BYTES, aligned_pages, make_records, span_gbps
from tieredkv.bench.tiers import default_dir
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.layout_copy import PageRows, copy_pages
from tieredkv.cache.transfer.transfer_jobs import TransferJobs


def _pool_views(transfer_jobs: TransferJobs) -> tuple[np.ndarray, np.ndarray]:
    """int16 numpy views: device (layers * 2, pages, run), host (pages, layers * 2, run)."""
    slabs = LAYOUT.num_layers * 2
    device = transfer_jobs.device_pool.kv.view(torch.int16).numpy()
    host = transfer_jobs.host_pool.kv.view(torch.int16).numpy()
    return device.reshape(slabs, device.shape[2], -1), host.reshape(host.shape[0], slabs, -1)


def breakdown(
    transfer_jobs: TransferJobs,
    store: DiskStore | None,
    batch: int,
    reps: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    """GB/s of each stage and alternative for one batch of `batch` pages (see module doc);
    without a `store`, the memory stages only."""
    num_pages = transfer_jobs.host_pool.num_pages
    host_pages = rng.permutation(num_pages)[:batch].tolist()
    device_pages = rng.permutation(num_pages)[:batch].tolist()
    host_index, device_index = torch.tensor(host_pages), torch.tensor(device_pages)
    host_kv, device_kv = transfer_jobs.host_pool.kv, transfer_jobs.device_pool.kv
    kernels = transfer_jobs.kernels
    shape = (batch, *LAYOUT.page_shape)
    reused = torch.empty(shape, dtype=LAYOUT.dtype)
    reused.fill_(0)
    device_np, host_np = _pool_views(transfer_jobs)
    device_rows, host_rows = PageRows.layer_major(device_kv), PageRows.page_major(host_kv)

    def per_page(to_device: bool) -> None:
        for host_page, device_page in zip(host_pages, device_pages, strict=True):
            if to_device:
                np.copyto(device_np[:, device_page], host_np[host_page])
            else:
                np.copyto(host_np[host_page], device_np[:, device_page])

    stages = {
        "job host->device": lambda: transfer_jobs.job(
            Tier.HOST, Tier.DEVICE, host_pages, device_pages, []
        )(),
        "job device->host": lambda: transfer_jobs.job(
            Tier.DEVICE, Tier.HOST, device_pages, host_pages, []
        )(),
        "staging: index_select into torch.empty": lambda: torch.index_select(
            host_kv, 0, host_index, out=torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "staging: index_select into a reused buffer": lambda: torch.index_select(
            host_kv, 0, host_index, out=reused
        ),
        "scatter_pages (into the device pool)": lambda: kernels.scatter_pages(
            device_kv, device_index, reused
        ),
        "gather_pages (from the device pool)": lambda: kernels.gather_pages(
            device_kv, device_index
        ),
        "host index_copy_ of staging": lambda: host_kv.index_copy_(0, host_index, reused),
        "alt: numpy copy per page host->device": lambda: per_page(True),
        "alt: numpy copy per page device->host": lambda: per_page(False),
        "alt: the job's copy on 1 thread host->device": lambda: copy_pages(
            device_rows, device_pages, host_rows, host_pages
        ),
        "alt: the job's copy on 1 thread device->host": lambda: copy_pages(
            host_rows, host_pages, device_rows, device_pages
        ),
    }
    result = {name: median_seconds(run, reps) for name, run in stages.items()}
    if store is not None:
        result |= _disk_stages(transfer_jobs, store, host_pages, reps)
    return {name: batch * LAYOUT.page_bytes / seconds / 1e9 for name, seconds in result.items()}


def _disk_stages(
    transfer_jobs: TransferJobs, store: DiskStore, host_pages: list[int], reps: int
) -> dict[str, float]:
    """Seconds of each disk stage for the host pages `host_pages`."""
    batch = len(host_pages)
    shape = (batch, *LAYOUT.page_shape)
    aligned = aligned_pages(batch)
    slots = store.alloc(batch)
    records = make_records(batch)
    forget = lambda: drop_file(store.directory / STORE_FILE)  # noqa: E731
    stages = {
        "job host->disk": lambda: transfer_jobs.job(
            Tier.HOST, Tier.DISK, host_pages, slots, records
        )(),
        "write_pages from torch.empty": lambda: store.write_pages(
            slots, records, torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "write_pages from an aligned reused buffer": lambda: store.write_pages(
            slots, records, aligned
        ),
    }
    result = {name: median_seconds(run, reps) for name, run in stages.items()}
    reads = {
        "job disk->host": lambda: transfer_jobs.job(
            Tier.DISK, Tier.HOST, slots, host_pages, records
        )(),
        "read_pages into torch.empty": lambda: store.read_pages(
            slots, records, torch.empty(shape, dtype=LAYOUT.dtype)
        ),
        "read_pages into an aligned reused buffer": lambda: store.read_pages(
            slots, records, aligned
        ),
    }
    result |= {name: median_seconds(run, reps, forget) for name, run in reads.items()}
    store.free(slots)
    return result


def random_pages(count: int, rng: np.random.Generator) -> torch.Tensor:
    """`aligned_pages(count)` holding seeded random bytes (a distinct page per slot)."""
    pages = aligned_pages(count)
    pages.view(torch.uint8).numpy().reshape(-1)[:] = np.frombuffer(
        rng.bytes(pages.numel() * 2), dtype=np.uint8
    )
    return pages


def store_gbps(
    store: DiskStore, data: torch.Tensor, batch: int, threads: int, reps: int
) -> tuple[Rate, Rate, bool]:
    """(write, read) GB/s of batches of `batch` pages, each split evenly over `threads` disk
    workers (one write_pages / read_pages call each, as the transfer queue's disk pool issues them),
    and whether every page read back verified and equal. `data` (num_pages, *page_shape)."""
    num_groups = store.num_pages // batch
    records = make_records(batch)
    slots = store.alloc(num_groups * batch)  # a fresh store: slots 0, 1, 2, ... in order
    out = aligned_pages(num_groups * batch)
    parts = [slice(batch * i // threads, batch * (i + 1) // threads) for i in range(threads)]
    verified: list[bool] = []
    pool = ThreadPoolExecutor(threads)

    def write_part(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        store.write_pages(slots[at], records[part], data[at])

    def read_part(group: int, part: slice) -> None:
        at = slice(group * batch + part.start, group * batch + part.stop)
        verified.extend(store.read_pages(slots[at], records[part], out[at]))

    def on_pool(transfer: Callable[[int, slice], None]) -> Callable[[int], object]:
        return lambda group: list(pool.map(lambda part: transfer(group, part), parts))

    try:
        write, read = span_gbps(
            num_groups,
            batch,
            reps,
            on_pool(write_part),
            on_pool(read_part),
            lambda: drop_file(store.directory / STORE_FILE),
        )
    finally:
        pool.shutdown()
        store.free(slots)
    read_groups = min((reps + 1) * max(REP_BYTES // (batch * LAYOUT.page_bytes), 1), num_groups)
    checked = read_groups * batch  # the groups the timed reads filled, from group 0 on
    ok = all(verified) and torch.equal(
        data[:checked].view(torch.int16), out[:checked].view(torch.int16)
    )
    return write, read, ok


def store_alone(store: DiskStore, batch: int, reps: int, rng: np.random.Generator) -> dict:
    """GB/s of the store alone, on 1 and 2 callers a batch (every page read back verified)."""
    data = random_pages(store.num_pages, rng)  # (num_pages, *page_shape) bf16, aligned
    result = {}
    for threads in (1, 2):
        write, read, ok = store_gbps(store, data, batch, threads, reps)
        assert ok, f"the store read back wrong bytes ({threads} callers)"
        result[f"store alone, {threads} caller(s), write"] = write.gbps
        result[f"store alone, {threads} caller(s), read"] = read.gbps
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/tier_breakdown.py", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--dir", type=Path, default=None, help="where temp files go (default: ~/.cache/tieredkv)")
    add("--batch", type=int, default=1024, help="pages per job")
    add("--reps", type=int, default=5, help="timed repetitions (medians), after one warm-up")
    add("--seed", type=int, default=0)
    add("--memcpy-bytes", type=int, default=512 << 20)
    add("--memory-only", action="store_true", help="no disk stages")
    add("--json", type=Path, default=None, metavar="PATH", help="also write the figures here")
    add("--quick", action="store_true", help="tiny sizes, for tests (figures meaningless)")
    return parser


def measure(args: argparse.Namespace, directory: Path) -> dict[str, object]:
    """memcpy on one thread, then every stage (the disk ones in a store under `directory`)."""
    rng = np.random.default_rng(args.seed)
    memcpy = memcpy_gbps(args.memcpy_bytes, args.reps, rng)
    store = None
    if not args.memory_only:
        capacity = 2 * args.batch * LAYOUT.page_bytes + (16 << 20)
        store = DiskStore(directory / "store", b"bench", LAYOUT, capacity)
    transfer_jobs = make_transfer_jobs(2 * args.batch, store, args.seed)
    try:
        try:
            stages = breakdown(transfer_jobs, store, args.batch, args.reps, rng)
        finally:
            transfer_jobs.close()
        if store is not None:
            stages |= store_alone(store, args.batch, args.reps, rng)
    finally:
        if store is not None:
            store.close()
    return {"batch_pages": args.batch, "memcpy_gbps": memcpy, "gbps": stages}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.batch, args.reps, args.memcpy_bytes = 16, 1, 16 << 20
    root = args.dir if args.dir is not None else default_dir()
    try:
        with tempfile.TemporaryDirectory(dir=root, prefix="tieredkv-bench-") as tmp:
            report = measure(args, Path(tmp))
    except OSError as error:
        print(f"tier_breakdown: error: {error} (under {root})", file=sys.stderr)
        return 1
    memcpy = report["memcpy_gbps"]
    print(f"memcpy {memcpy:.2f} GB/s on 1 thread; {args.batch} pages of {LAYOUT.page_bytes:,} B")
    for name, gbps in report["gbps"].items():
        print(f"  {name:<46}{gbps:>8.2f} GB/s{gbps / memcpy:>7.0%}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

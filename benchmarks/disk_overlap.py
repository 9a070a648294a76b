"""Would a disk history loaded layer by layer, beside the forward, reach the first token sooner?

A disk turn today is serial: the promotion reads the history's pages (whole pages, all layers),
verifies and copies them, then the forward runs. Engines on GPUs (SGLang's HiCache, LMCache)
overlap the two instead, layer by layer: layer l's attention waits only for layer l's KV. This
measures whether that would pay on this machine, in one process configured like `tieredkv
serve` (run it with tcmalloc and Intel OpenMP preloaded, KMP_BLOCKTIME=5 and
TCMALLOC_RELEASE_RATE=0, as below; the forward runs on its own thread, as the engine's does):

  forward        the suffix's forward over the prefix already in the pool (a device turn)
  raw read       the prefix's page-major records read with O_DIRECT in 4 chunks on 4 threads,
                 nothing else: the limit beside the next line, same bytes, same parallelism
  serial read    the same reads, each chunk checksummed (xxh3, as the store does) and copied
                 twice as it lands (into the layer-major pool, then a sequence's workspace)
  grouped read   the same bytes and work in G layer groups: group g of every page (one read
                 per page), then group g + 1; the time each group is ready
  both           the forward and the grouped read started together: each one's time

serial TTFT ~ serial read + forward; overlapped TTFT ~ the forward beside the grouped read, or
later where a group is ready after the forward reaches its layers (the forward taken as evenly
spread over the layers). Run:

    LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 $PWD/.venv/lib/libiomp5.so" \
      KMP_BLOCKTIME=5 TCMALLOC_RELEASE_RATE=0 \
      .venv/bin/python benchmarks/disk_overlap.py --dir bench-results/overlap
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash

from tieredkv.cache.disk.direct_io import DiskIOBackend
from tieredkv.cache.disk.store import IO_THREADS, MIN_CHUNKS
from tieredkv.cache.page_layout import PageLayout, aligned_empty


class PromotionWork:
    """A prefix's pages as page-major records in a file, and the CPU work a promotion does with
    them: read (O_DIRECT where the filesystem allows), checksum, copy into the layer-major pool
    layout, copy again into a workspace."""

    def __init__(self, layout: PageLayout, num_pages: int, directory: Path, seed: int) -> None:
        self.layout = layout
        self.num_pages = num_pages
        page_bytes = layout.page_bytes
        data = np.random.default_rng(seed).integers(0, 256, num_pages * page_bytes, np.uint8)
        self.io = DiskIOBackend()
        self.path = directory / "records"
        self.handle = self.io.open(self.path, data.nbytes, create=True)
        self.io.pwrite(self.handle, 0, data)
        self.io.fsync(self.handle)
        self.expected = torch.from_numpy(data).view(layout.dtype).view(self._page_major_shape)
        self.buffer = aligned_empty(data.nbytes)  # the records as read
        self.read_view = (
            torch.from_numpy(self.buffer).view(layout.dtype).view(self._page_major_shape)
        )
        layer_major = (layout.num_layers, 2, num_pages, layout.page_size)
        layer_major += (layout.num_kv_heads, layout.head_dim)
        self.pool = torch.empty(layer_major, dtype=layout.dtype)
        self.workspace = torch.empty_like(self.pool)
        self.threads = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="read")

    @property
    def _page_major_shape(self) -> tuple[int, ...]:
        return (self.num_pages, *self.layout.page_shape)

    def close(self) -> None:
        self.threads.shutdown()
        self.io.close(self.handle)
        self.path.unlink()

    def _read(self, offset: int, length: int) -> None:
        self.io.pread(self.handle, offset, length, self.buffer[offset : offset + length])

    def _checksum(self, offset: int, length: int) -> None:
        xxhash.xxh3_64(memoryview(self.buffer)[offset : offset + length]).intdigest()

    def _copy(self, pages: slice, layers: slice) -> None:
        """Copy records as read into the pool, and from there into the workspace."""
        records = self.read_view[pages, layers]  # (pages, layers, 2, page_size, heads, dim)
        self.pool[layers, :, pages].copy_(records.permute(1, 2, 0, 3, 4, 5))
        self.workspace[layers, :, pages].copy_(self.pool[layers, :, pages])

    def read_chunked(self, land: bool) -> float:
        """Whole pages in MIN_CHUNKS chunks (the store splits a promotion this size so), landed
        in order as they come; seconds."""
        start = time.perf_counter()
        page_bytes = self.layout.page_bytes
        step = -(-self.num_pages // MIN_CHUNKS)
        chunks = [(p, min(p + step, self.num_pages)) for p in range(0, self.num_pages, step)]
        futures = [
            self.threads.submit(self._read, p0 * page_bytes, (p1 - p0) * page_bytes)
            for p0, p1 in chunks
        ]
        for (p0, p1), future in zip(chunks, futures, strict=True):
            future.result()  # SYNC: chunks land in order, as the store's pipeline hands them on
            if land:
                self._checksum(p0 * page_bytes, (p1 - p0) * page_bytes)
                self._copy(slice(p0, p1), slice(0, self.layout.num_layers))
        return time.perf_counter() - start

    def read_grouped(self, groups: int) -> list[float]:
        """Layer group by layer group, one read per page and group; seconds until each group
        has landed."""
        layers_per_group = self.layout.num_layers // groups
        group_bytes = self.layout.page_bytes // groups
        assert layers_per_group * groups == self.layout.num_layers, (self.layout, groups)
        start = time.perf_counter()
        futures = [
            [
                self.threads.submit(
                    self._read, page * self.layout.page_bytes + g * group_bytes, group_bytes
                )
                for page in range(self.num_pages)
            ]
            for g in range(groups)
        ]
        ready = []
        for g, group in enumerate(futures):
            layers = slice(g * layers_per_group, (g + 1) * layers_per_group)
            for page, future in enumerate(group):
                future.result()  # SYNC: a group lands once all its reads are in
                self._checksum(page * self.layout.page_bytes + g * group_bytes, group_bytes)
            self._copy(slice(0, self.num_pages), layers)
            ready.append(time.perf_counter() - start)
        return ready

    def landed_intact(self) -> bool:
        """Whether the pool and the workspace hold the records' bytes, each in its layout
        (compared as integers: random bytes hold NaN patterns, and NaN != NaN)."""
        wanted = self.expected.permute(1, 2, 0, 3, 4, 5).view(torch.int16)
        return all(torch.equal(t.view(torch.int16), wanted) for t in (self.pool, self.workspace))


def overlapped_s(forward_s: float, ready_s: list[float]) -> float:
    """The first token's time when layer group g's attention waits for group g to be ready and
    the forward spends an equal share on each group."""
    groups = len(ready_s)
    return max(forward_s, *(r + (groups - g) * forward_s / groups for g, r in enumerate(ready_s)))


def spread(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}


def measure(
    work: PromotionWork, forward: Callable[[], float], groups: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Each figure `repeats` times (after one warm-up of each), interleaved."""
    engine = ThreadPoolExecutor(1, thread_name_prefix="engine")
    copy_thread = ThreadPoolExecutor(1, thread_name_prefix="copy")
    names = ("forward", "raw read", "serial read", "grouped read", "both: forward")
    names += ("both: grouped read", "both: first group", "serial ttft", "overlapped ttft")
    samples: dict[str, list[float]] = {name: [] for name in names}
    try:
        for warm_up in [True] + [False] * repeats:
            forward_s = engine.submit(forward).result()
            raw_s, serial_s = work.read_chunked(False), work.read_chunked(True)
            grouped = work.read_grouped(groups)
            ready = copy_thread.submit(work.read_grouped, groups)
            both_forward_s = engine.submit(forward).result()
            both_ready = ready.result()
            if warm_up:
                continue
            samples["forward"].append(forward_s)
            samples["raw read"].append(raw_s)
            samples["serial read"].append(serial_s)
            samples["grouped read"].append(grouped[-1])
            samples["both: forward"].append(both_forward_s)
            samples["both: grouped read"].append(both_ready[-1])
            samples["both: first group"].append(both_ready[0])
            samples["serial ttft"].append(serial_s + forward_s)
            samples["overlapped ttft"].append(overlapped_s(both_forward_s, both_ready))
    finally:
        engine.shutdown()
        copy_thread.shutdown()
    return {name: spread(values) for name, values in samples.items()}


def model_forward(
    prefix_len: int, suffix_len: int, seed: int
) -> tuple[PageLayout, Callable[[], float]]:
    """The default model in bf16 with a prefix of random tokens in its pool; the returned
    function forwards a fresh suffix over it and returns the forward's seconds."""
    from tieredkv.model.loader import load_model
    from tieredkv.model.runner import ModelRunner, PagedSequence

    loaded = load_model(None, dtype=torch.bfloat16)
    vocab = loaded.config.vocab_size
    pages = 2 * -(-(prefix_len + suffix_len) // 16) + 8
    runner = ModelRunner.create(loaded.config, loaded.weights, num_pages=pages)
    generator = torch.Generator().manual_seed(seed)

    def token_ids(count: int) -> list[int]:
        return torch.randint(100, vocab, (count,), generator=generator).tolist()

    prefix = token_ids(prefix_len)
    sequence = PagedSequence(0, prefix)
    while sequence.kv_len < prefix_len:
        runner.forward([sequence.next_chunk(runner.pool, 512)])
    runner.release(0)
    prefix_pages = sequence.page_ids[: prefix_len // runner.page_size]
    next_id = iter(range(1, 1 << 30))

    def forward() -> float:
        turn = PagedSequence(next(next_id), prefix + token_ids(suffix_len))
        turn.kv_len, turn.page_ids = len(prefix_pages) * runner.page_size, list(prefix_pages)
        chunk = turn.next_chunk(runner.pool)
        start = time.perf_counter()
        runner.forward([chunk])
        seconds = time.perf_counter() - start
        runner.release(turn.seq_id)
        runner.pool.free(turn.page_ids[len(prefix_pages) :])
        return seconds

    return runner.pool.layout, forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefix", type=int, default=3136, help="history tokens (whole pages)")
    parser.add_argument("--suffix", type=int, default=64, help="the turn's new tokens")
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 3, 6])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="where the records go (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    layout, forward = model_forward(args.prefix, args.suffix, args.seed)
    report: dict = {"argv": argv, "threads": torch.get_num_threads()}
    report["ld_preload"] = os.environ.get("LD_PRELOAD", "")
    report["groups"] = {}
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tkv-overlap-"))
    directory.mkdir(parents=True, exist_ok=True)
    work = PromotionWork(layout, args.prefix // layout.page_size, directory, args.seed)
    try:
        report["direct_io"] = work.io.is_direct(work.handle)
        for groups in args.groups:
            report["groups"][groups] = figures = measure(work, forward, groups, args.repeats)
            print(
                f"{groups} layer groups, {work.buffer.nbytes / 1e6:.1f} MB, ms, median (min-max):"
            )
            for name, f in figures.items():
                print(f"  {name:20s} {f['median_ms']:6.0f} ({f['min_ms']:.0f}-{f['max_ms']:.0f})")
        assert work.landed_intact(), "the benchmark's copies lost bytes"
    finally:
        work.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

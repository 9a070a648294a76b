"""How much chat history the disk tier holds for a sliding-window model, and what a next turn
reuses from it: the same store file bytes as whole-page records (`--disk-whole-pages`) and
split (the default: a record per layer of a page, the sliding layers written only where a next
turn's window reads them).

The cache under test is the real one (`build_cache` with a device tier, a small host tier and
a disk store on this machine's disk: write-through, demotion down to the disk, the split
store's layer records, its reclaim and eviction, the match cut where a window would read a
missing sliding part); the device and host keep whole pages, so the disk is measured alone
(`sliding_device` and `sliding_history` measure those tiers). No model runs: what a tier holds
and what a match reuses depend on pages and the tree. The model and workloads are
`sliding_history`'s (Gemma 3 1B's layer shape, chats interleaved turn by turn), with heads of
32 dimensions so that a layer page is 4 KiB, as the disk's O_DIRECT alignment wants it (Gemma 3
1B's own: 16 KiB in bf16). The limit a turn is judged by is the cache's own arithmetic, outside
the code under test: its history in whole pages (`reusable`).

    .venv/bin/python -m benchmarks.sliding_disk
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.sliding_history import (
    PAGE_SIZE,
    Workload,
    gemma3_1b_shape,
    replay_chats,
    reuse_cell,
    run_and_write,
    workload_cells,
)
from tieredkv.bench.result_file import machine_line
from tieredkv.cache.build import build_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.model_config import ModelConfig

HEAD_DIM = 32  # 2 x 16 tokens x 32 x 4 B: a layer page of 4 KiB


def replay(model: ModelConfig, split: bool, workload: Workload, args: argparse.Namespace) -> dict:
    """`workload` on a fresh cache whose disk tier has the file bytes of `args.disk_pages`
    whole-page records, in a new directory under `args.disk_root`."""
    layout = PageLayout.for_model(model, PAGE_SIZE, torch.float32)
    with tempfile.TemporaryDirectory(dir=args.disk_root) as directory:
        config = CacheConfig(
            page_size=PAGE_SIZE,
            device_cache_bytes=args.device_pages * layout.page_bytes,
            host_cache_bytes=args.host_pages * layout.page_bytes,
            disk_cache_dir=Path(directory),
            disk_cache_bytes=args.disk_pages * (layout.page_bytes + 4096),
            write_policy=WritePolicy.WRITE_THROUGH,
            host_whole_pages=True,
            device_whole_pages=True,  # the disk measured alone
            disk_whole_pages=not split,
        )
        cache = build_cache(config, layout, b"sliding-disk", "cpu", model=model)
        try:
            record = _replay_on(cache, workload, args)
        finally:
            cache.close()
    return {**workload._asdict(), "split": split, **record}


def _replay_on(cache, workload: Workload, args: argparse.Namespace) -> dict:
    reuse = replay_chats(cache, workload, args.seed, Tier.DISK)
    pages, sliding = cache.tier_parts_held(Tier.DISK)
    return {
        "disk_file_bytes": cache.pools.disk.file_bytes,
        "disk_capacity_bytes": cache.tier_capacity_bytes(Tier.DISK),
        "disk_full_tokens": pages * PAGE_SIZE,
        "disk_sliding_tokens": sliding * PAGE_SIZE,
        "reused_tokens": reuse["reused_tokens"],
        "reusable_tokens": reuse["reusable_tokens"],
        "reused_from_disk_tokens": reuse["reused_from_tier_tokens"],
        "reuse_of_reusable": reuse["reuse_of_reusable"],
        "disk_errors": sum(cache.disk_page_errors().values()),
        "integrity_ok": cache.check_integrity().ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device-pages", type=int, default=256)
    parser.add_argument("--host-pages", type=int, default=128)
    parser.add_argument("--disk-pages", type=int, default=2304, help="whole-page records")
    parser.add_argument("--disk-root", type=Path, default=None, help="default: the temp dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = gemma3_1b_shape(head_dim=HEAD_DIM)
    run_and_write("sliding_disk", replay, args, {"disk_whole_tokens": args.disk_pages}, model)
    return 0


def render_markdown(results: list[dict]) -> str:
    """The latest result: per workload, whole-page or layer records, what the disk holds and
    what the next turns reused of what they could."""
    result = results[-1]
    summary, settings = result["summary"], result["settings"]
    lines = [
        "## Sliding-window layers: history the disk tier holds",
        "",
        f"`{result['dir']}`, {machine_line(result)}; `python -m benchmarks.sliding_disk` "
        "(the cache alone, no model runs: counts, not timings).",
        "",
        f"Gemma 3 1B's layer shape ({summary['full_layers']} full-attention layers, "
        f"{summary['sliding_layers']} sliding with a {summary['window']}-token window), 4 KiB "
        f"layer pages, page {settings['page_size']}; `sliding_history`'s chats; device "
        f"{settings['device_pages']} and host {settings['host_pages']} whole pages, the disk "
        f"the file bytes of {summary['disk_whole_tokens']:,} tokens of whole-page records; "
        "write-through. The limit: a turn reuses at most its history in whole pages "
        "(reusable). Each layer record carries a header of its own, so where every page keeps "
        "its sliding layers (short chats, within one window) layer records hold a few percent "
        "fewer tokens than whole ones.",
        "",
        "| chats | tokens a chat | history, all chats | disk records | disk tokens, full "
        "layers | disk tokens, sliding layers | reused / reusable, turns 2+ | of it from disk |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for record in result["records"]:
        lines.append(
            f"{workload_cells(record, 'layer')}{record['disk_full_tokens']:,} | "
            f"{record['disk_sliding_tokens']:,} | {reuse_cell(record)} | "
            f"{record['reused_from_disk_tokens']:,} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

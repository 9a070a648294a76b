"""lz4 on real KV pages: ratio and compress/decompress MB/s, the data behind the default of
`--remote-compression`.

Prefills one prompt of natural text (this repository's README, ~1k tokens) through the
default model in each dtype, takes its full pages from the device pool, and times the remote
tier's codec on them (lz4 block, default mode, as `record.encode_value` calls it) beside a
plain copy of the same bytes (this machine's memory limit for the same work, same thread).
Medians of timed repeats after a warm-up, with min and max. Run:

    .venv/bin/python benchmarks/remote_compression.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import lz4.block
import torch

from tieredkv.model.loader import load_model
from tieredkv.model.runner import ModelRunner, PagedSequence

PAGE_SIZE = 16
TEXT = Path(__file__).resolve().parent.parent / "README.md"


def rates(fn: Callable[[], object], num_bytes: int, repeats: int) -> tuple[float, float, float]:
    """(median, min, max) MB/s of `fn` over `num_bytes`, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    mb = num_bytes / 1e6
    return mb / statistics.median(times), mb / max(times), mb / min(times)


def prompt_pages(dtype: torch.dtype, num_tokens: int) -> list[bytes]:
    """The raw bytes of each full page of a prefilled natural-text prompt."""
    torch.manual_seed(0)
    loaded = load_model(dtype=dtype)
    ids = loaded.tokenizer.encode(TEXT.read_text(encoding="utf-8"))[:num_tokens]
    runner = ModelRunner.create(
        loaded.config, loaded.weights, num_pages=num_tokens // PAGE_SIZE + 2, page_size=PAGE_SIZE
    )
    seq = PagedSequence(0, ids)
    with torch.inference_mode():
        runner.forward([seq.next_chunk(runner.pool)])
    kv = runner.pool.kv  # (layers, 2, num_pages, page_size, kv_heads, head_dim)
    full = seq.page_ids[: len(ids) // PAGE_SIZE]
    pages = [kv[:, :, page].contiguous().view(torch.uint8).numpy().tobytes() for page in full]
    runner.close()
    return pages


def codec_figures(pages: list[bytes], repeats: int) -> dict[str, float]:
    """lz4's ratio and MB/s (median, min, max) on `pages`, and a plain copy's MB/s."""
    raw_bytes = sum(len(page) for page in pages)
    packed = [lz4.block.compress(page, store_size=False) for page in pages]

    def compress() -> None:
        for page in pages:
            lz4.block.compress(page, store_size=False)

    def decompress() -> None:
        for page, stored in zip(pages, packed, strict=True):
            lz4.block.decompress(stored, uncompressed_size=len(page))

    def copy() -> None:
        for page in pages:
            bytearray(page)

    comp, dec = rates(compress, raw_bytes, repeats), rates(decompress, raw_bytes, repeats)
    return {
        "pages": len(pages),
        "page_bytes": len(pages[0]),
        "ratio": raw_bytes / sum(len(p) for p in packed),
        **dict(zip(("comp", "comp_min", "comp_max"), comp, strict=True)),
        **dict(zip(("dec", "dec_min", "dec_max"), dec, strict=True)),
        "copy": rates(copy, raw_bytes, repeats)[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"lz4 block (default mode) on the full pages of a {args.tokens}-token prefill "
        "(MB/s of raw page bytes; copy: the same bytes copied, this machine's limit)"
    )
    print(
        "dtype     pages  page_KiB  ratio  compress MB/s (min-max)  "
        "decompress MB/s (min-max)  copy MB/s"
    )
    for dtype in (torch.bfloat16, torch.float32):
        r = codec_figures(prompt_pages(dtype, args.tokens), args.repeats)
        name = str(dtype).removeprefix("torch.")
        print(
            f"{name:<9} {r['pages']:>5}  {r['page_bytes'] / 1024:>8.0f}  {r['ratio']:>5.3f}  "
            f"{r['comp']:>7.0f} ({r['comp_min']:.0f}-{r['comp_max']:.0f})"
            f"{'':>8}{r['dec']:>7.0f} ({r['dec_min']:.0f}-{r['dec_max']:.0f})"
            f"{'':>9}{r['copy']:>7.0f}"
        )


if __name__ == "__main__":
    main()

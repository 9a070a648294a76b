"""Check and time the Triton kernels on a CUDA device at the default model's shapes.

    python benchmarks/gpu_kernels.py [--quick] [--iters N] [--seed S]

For each case: the Triton result against the torch reference on the same device (exit status 1
if any differs beyond bf16 tolerance), then the median of warm runs timed with CUDA events, the
bytes it must move per second, and beside it the device's own copy bandwidth measured in this run
(a device-to-device copy, read + write counted). Default model: 30 layers, 9 query heads over 3
kv heads, head_dim 64, page_size 16, bf16.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import torch

LAYERS, HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 30, 9, 3, 64, 16
DTYPE = torch.bfloat16
BYTES = 2  # bf16
TOLERANCE = 2e-2


def time_ms(fn: Callable[[], object], iters: int) -> float:
    """Median milliseconds of `iters` warm runs, each bracketed by CUDA events."""
    for _ in range(3):  # warm-up: compile, caches
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # SYNC: the timing itself
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def memcpy_gbps(iters: int) -> float:
    """Device-to-device copy of 1 GiB, read + write bytes per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), iters)
    return 2 * src.numel() / ms / 1e6


def paged_inputs(kv_lens: list[int], q_lens: list[int], generator: torch.Generator) -> tuple:
    """A 2-layer pool holding every sequence's pages in shuffled order, plus q and metadata."""
    pages_per_seq = [-(-n // PAGE_SIZE) for n in kv_lens]
    num_pages = sum(pages_per_seq)
    shape = (2, 2, num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM)
    pool = torch.randn(shape, generator=generator, device="cuda").to(DTYPE)
    order = torch.randperm(num_pages, generator=generator, device="cuda").to(torch.int32)
    table = torch.zeros((len(kv_lens), max(pages_per_seq)), dtype=torch.int32, device="cuda")
    offset = 0
    for i, count in enumerate(pages_per_seq):
        table[i, :count] = order[offset : offset + count]
        offset += count
    q = torch.randn((sum(q_lens), HEADS, HEAD_DIM), generator=generator, device="cuda").to(DTYPE)
    starts = torch.tensor([0, *q_lens], device="cuda").cumsum(0).to(torch.int32)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    return q, pool[1, 0], pool[1, 1], table, starts, lens


def report(label: str, error: float, ms: float, gbps: float, copy_gbps: float, extra: str = ""):
    verdict = "ok" if error <= TOLERANCE else "MISMATCH"
    print(
        f"{label:<44} err {error:8.2e} {verdict:<8} {ms:9.3f} ms {gbps:8.1f} GB/s "
        f"({100 * gbps / copy_gbps:5.1f}% of copy) {extra}"
    )
    return error <= TOLERANCE


def bench_decode(kernels, reference, batch: int, context: int, iters: int, gen, copy: float):
    q, k, v, table, _, lens = paged_inputs([context] * batch, [1] * batch, gen)
    scale = HEAD_DIM**-0.5
    out = kernels.paged_decode_attention(q, k, v, table, lens, scale)
    expected = reference.paged_decode_attention(q, k, v, table, lens, scale)
    error = (out.float() - expected.float()).abs().max().item()
    ms = time_ms(lambda: kernels.paged_decode_attention(q, k, v, table, lens, scale), iters)
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * BYTES
    label = f"decode  batch {batch:3d} ctx {context:5d}"
    return report(label, error, ms, kv_bytes / ms / 1e6, copy)


def bench_prefill(kernels, reference, batch, prefix, q_len, iters, gen, copy):
    q, k, v, table, starts, lens = paged_inputs([prefix + q_len] * batch, [q_len] * batch, gen)
    scale = HEAD_DIM**-0.5
    args = (q, k, v, table, starts, lens, scale)
    out = kernels.paged_prefill_attention(*args, max_q_len=q_len)
    error = (out.float() - reference.paged_prefill_attention(*args).float()).abs().max().item()
    ms = time_ms(lambda: kernels.paged_prefill_attention(*args, max_q_len=q_len), iters)
    kv_bytes = 2 * batch * (prefix + q_len) * KV_HEADS * HEAD_DIM * BYTES
    attended = batch * (q_len * prefix + q_len * (q_len + 1) // 2)  # (query, key) pairs
    tflops = 4 * HEADS * HEAD_DIM * attended / ms / 1e9
    label = f"prefill batch {batch:3d} prefix {prefix:5d} q_len {q_len:5d}"
    return report(label, error, ms, kv_bytes / ms / 1e6, copy, f"{tflops:6.1f} TFLOP/s")


def bench_pages(kernels, reference, num_pages: int, iters: int, gen, copy: float):
    pool_pages = 2 * num_pages
    shape = (LAYERS, 2, pool_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM)
    pool = torch.randn(shape, generator=gen, device="cuda").to(DTYPE)
    ids = torch.randperm(pool_pages, generator=gen, device="cuda")[:num_pages]
    staging = kernels.gather_pages(pool, ids)
    ok = torch.equal(staging, reference.gather_pages(pool, ids))
    moved = 2 * staging.numel() * BYTES  # read + write
    ms = time_ms(lambda: kernels.gather_pages(pool, ids, out=staging), iters)
    ref_ms = time_ms(lambda: reference.gather_pages(pool, ids, out=staging), iters)
    ok &= report(f"gather  {num_pages:5d} pages", 0.0 if ok else 1.0, ms, moved / ms / 1e6, copy,
                 f"(torch index_select {moved / ref_ms / 1e6:7.1f} GB/s)")  # fmt: skip
    target = torch.zeros_like(pool)
    kernels.scatter_pages(target, ids, staging)
    scattered = torch.equal(target[:, :, ids], pool[:, :, ids])
    ms = time_ms(lambda: kernels.scatter_pages(target, ids, staging), iters)
    ref_ms = time_ms(lambda: reference.scatter_pages(target, ids, staging), iters)
    scattered &= report(f"scatter {num_pages:5d} pages", 0.0 if scattered else 1.0, ms,
                        moved / ms / 1e6, copy,
                        f"(torch index_copy_ {moved / ref_ms / 1e6:7.1f} GB/s)")  # fmt: skip
    return ok and scattered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20, help="timed runs per case (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device here; this benchmark needs one (run it on a GPU box).")
        return 2
    try:
        from tieredkv.kernels import reference, select_backend

        kernels = select_backend(torch.device("cuda"), prefer="triton")
    except ImportError as error:
        print(f"gpu_kernels: {error}")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    copy = memcpy_gbps(args.iters)
    print(f"device copy (read + write): {copy:.1f} GB/s")
    batches = [1, 64] if args.quick else [1, 8, 32, 64]
    contexts = [2048, 8192] if args.quick else [2048, 4096, 8192]
    ok = True
    for batch in batches:
        for context in contexts:
            ok &= bench_decode(kernels, reference, batch, context, args.iters, gen, copy)
    prefills = [(1, 0, 2048), (1, 6144, 2048), (4, 2048, 512), (16, 4096, 128), (64, 2048, 16)]
    for batch, prefix, q_len in prefills[:3] if args.quick else prefills:
        ok &= bench_prefill(kernels, reference, batch, prefix, q_len, args.iters, gen, copy)
    for num_pages in [64, 1024] if args.quick else [64, 256, 1024]:
        ok &= bench_pages(kernels, reference, num_pages, args.iters, gen, copy)
    print("all kernels match the reference" if ok else "SOME KERNELS DIFFER FROM THE REFERENCE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

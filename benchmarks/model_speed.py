"""Prefill tokens/s and decode ms/token of tieredkv's forward pass beside transformers.

Same machine, same weights, same dtype, same run. Medians of timed repeats after a warm-up;
random token ids from a fixed seed. Run:

    .venv/bin/python benchmarks/model_speed.py --dtype bfloat16

For transformers' best CPU figure, preload tcmalloc and Intel OpenMP for the whole process:
    LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 $(.venv/bin/python -c \
      'import sys; print(sys.prefix)')/lib/libiomp5.so" .venv/bin/python benchmarks/model_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner, PagedSequence


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_ids(count: int, vocab: int, generator: torch.Generator) -> list[int]:
    # skip the first ids: special tokens
    return torch.randint(100, vocab, (count,), generator=generator).tolist()


class OurModel:
    def __init__(self, loaded: LoadedModel, max_len: int, batch: int) -> None:
        pages = batch * (-(-max_len // 16) + 2)
        self.runner = ModelRunner.create(
            loaded.config, loaded.weights, num_pages=pages, max_model_len=max_len
        )

    def prefill(self, ids: list[int]) -> None:
        seq = PagedSequence(0, ids)
        self.runner.forward([seq.next_chunk(self.runner.pool)])
        self.runner.release(0)
        seq.free(self.runner.pool)

    def decode_step_time(self, prompts: list[list[int]], steps: int) -> float:
        seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
        for seq in seqs:
            self.runner.forward([seq.next_chunk(self.runner.pool)])

        def step() -> None:
            for seq in seqs:
                seq.token_ids.append(seq.token_ids[-1])
            self.runner.forward([seq.next_chunk(self.runner.pool) for seq in seqs])

        try:
            return median_seconds(step, steps, warmup=2)
        finally:
            for seq in seqs:
                self.runner.release(seq.seq_id)
                seq.free(self.runner.pool)


class TransformersModel:
    def __init__(self, loaded: LoadedModel, dtype: torch.dtype) -> None:
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            loaded.model_dir, dtype=dtype
        ).eval()

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> None:
        self.model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def decode_step_time(self, prompts: list[list[int]], steps: int) -> float:
        out = self.model(torch.tensor(prompts), use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        next_ids = torch.tensor([[p[-1]] for p in prompts])

        def step() -> None:
            nonlocal cache
            result = self.model(next_ids, past_key_values=cache, use_cache=True)
            cache = result.past_key_values

        return median_seconds(step, steps, warmup=2)


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    loaded = load_model(None, dtype=dtype)
    vocab = loaded.config.vocab_size
    max_len = max([*args.prefill, args.decode_context + args.decode_steps + 8])
    engines = {"tieredkv": OurModel(loaded, max_len, max(args.batches))}
    if not args.skip_transformers:
        engines["transformers"] = TransformersModel(loaded, dtype)
    results: dict = {
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "prefill_tok_per_s": {},
        "decode_ms_per_token": {},
    }
    for length in args.prefill:
        ids = random_ids(length, vocab, generator)
        for name, engine in engines.items():
            seconds = median_seconds(lambda e=engine, ids=ids: e.prefill(ids), args.repeats)
            results["prefill_tok_per_s"].setdefault(name, {})[length] = round(length / seconds)
            print(
                f"prefill {length:5d} tokens  {name:12s} {length / seconds:8.0f} tok/s", flush=True
            )
    for batch in args.batches:
        prompts = [random_ids(args.decode_context, vocab, generator) for _ in range(batch)]
        for name, engine in engines.items():
            seconds = engine.decode_step_time(prompts, args.decode_steps)
            per_token = seconds / batch * 1000
            results["decode_ms_per_token"].setdefault(name, {})[batch] = round(per_token, 2)
            print(
                f"decode batch {batch:2d} @ {args.decode_context} ctx  {name:12s} "
                f"{seconds * 1000:8.1f} ms/step  {per_token:6.2f} ms/token",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--prefill", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--decode-context", type=int, default=3072)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

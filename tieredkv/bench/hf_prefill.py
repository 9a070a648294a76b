"""Hugging Face transformers' prefill speed on the same model, dtype and machine, in the same
run: the yardstick beside the recompute baseline's tokens/s (a recompute server that is much
slower than plain transformers would flatter every cache speed-up)."""

from __future__ import annotations

import statistics
import time


def transformers_prefill(
    model: str | None, dtype: str, num_tokens: int, threads: int | None, repeats: int = 3
) -> dict:
    """Prefill tokens/s of transformers for one `num_tokens` prompt (median of `repeats` after
    a warm-up; random ids from a fixed seed). Returns {"tokens", "tok_per_s", "seconds"}."""
    import torch  # heavy and optional for the client-only mode: imported here
    import transformers

    from tieredkv.model.loader import resolve_model_dir

    if threads is not None:
        torch.set_num_threads(threads)
    model_dir = resolve_model_dir(model)
    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, hf.config.vocab_size, (1, num_tokens), generator=generator)

    @torch.inference_mode()
    def prefill() -> float:
        start = time.perf_counter()
        hf(ids, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start

    prefill()  # warm-up
    seconds = statistics.median(prefill() for _ in range(repeats))
    return {
        "tokens": num_tokens,
        "seconds": seconds,
        "tok_per_s": num_tokens / seconds,
        "threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }

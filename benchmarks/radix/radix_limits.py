"""What this machine allows the tree right now, measured in the same run as the tree.

- CPU share: a busy loop counts the time it was not running (gaps over 200 µs: another
  process had the core). On a shared machine p99s are mostly these gaps, not the tree.
- Compare floor: one C-level comparison of a prompt's tokens with a stored run of the same
  values (new int objects, as a tokenizer hands them out), tuple conversion included: the
  least any tree that keeps tokens as ints must spend to confirm a whole-prompt match.
- Packed floor: packing the same new ints into int32 bytes once, plus one memcmp with a stored
  packed run: the least a tree of packed runs (this one) spends on a prompt it has never seen.
- Memcmp floor: one memcmp of a prompt already packed with a stored packed copy: the least a
  match of a whole prompt handed over as a ready key can cost.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from tieredkv.cache.index.page_key import token_bytes

GAP_NS = 200_000


def cpu_share(seconds: float = 0.5) -> dict[str, float]:
    """The share of `seconds` of wall time a busy loop actually ran, and its gaps."""
    gaps: list[int] = []
    start = last = time.perf_counter_ns()
    end = start + int(seconds * 1e9)
    while last < end:
        now = time.perf_counter_ns()
        if now - last > GAP_NS:
            gaps.append(now - last)
        last = now
    elapsed = last - start
    return {
        "share": 1 - sum(gaps) / elapsed,
        "gaps_per_s": len(gaps) / (elapsed / 1e9),
        "median_gap_ms": statistics.median(gaps) / 1e6 if gaps else 0.0,
    }


def _floor_us(
    num_tokens: int, repeats: int, seed: int, stored_form: Callable[[list[int]], object]
) -> float:
    """Median µs of `stored == stored_form(prompt)`, the prompt in new int objects each time."""
    ids = np.random.default_rng(seed).integers(256, 49152, num_tokens)
    stored = stored_form(ids.tolist())
    times = []
    for _ in range(repeats):
        prompt = ids.tolist()  # new int objects each time
        begin = time.perf_counter_ns()
        equal = stored == stored_form(prompt)
        times.append(time.perf_counter_ns() - begin)
        assert equal
    return statistics.median(times) / 1e3


def memcmp_floor_samples_ns(num_tokens: int, repeats: int, seed: int) -> list[int]:
    """Nanoseconds of `stored == packed` per repeat, both `num_tokens` tokens as int32 bytes
    in separate buffers (equal contents, so the comparison reads every byte)."""
    ids = np.random.default_rng(seed).integers(256, 49152, num_tokens).tolist()
    stored, packed = token_bytes(ids), token_bytes(ids)
    times = []
    for _ in range(repeats):
        begin = time.perf_counter_ns()
        equal = stored == packed
        times.append(time.perf_counter_ns() - begin)
        assert equal
    return times


def compare_floor_us(num_tokens: int, repeats: int, seed: int) -> float:
    """Comparing a prompt as ints with a stored copy: `stored == tuple(prompt)`."""
    return _floor_us(num_tokens, repeats, seed, tuple)


def packed_floor_us(num_tokens: int, repeats: int, seed: int) -> float:
    """Packing a prompt and one memcmp: `stored == token_bytes(prompt)`."""
    return _floor_us(num_tokens, repeats, seed, token_bytes)

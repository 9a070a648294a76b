"""benchmarks/radix_vs_sglang.py still drives the engine's RequestPages (tieredkv alone)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "radix_vs_sglang.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("radix_vs_sglang", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_trace_replays_with_evictions_and_a_sound_cache() -> None:
    bench = _load()
    trace = bench.make_trace(seed=0, users=4, rounds=3)
    assert trace == bench.make_trace(seed=0, users=4, rounds=3)  # seeded
    assert all(2500 <= len(turn.prompt) <= 3400 for turn in trace)
    systems = bench.replay(trace, num_pages=600, sg=None)  # checks integrity at the end
    tieredkv = systems["tieredkv"]
    assert tieredkv.hit_tokens > 0 and tieredkv.evicted_pages > 0
    assert len(tieredkv.samples["match"]) == 2 * len(trace)
    assert tieredkv.samples["insert"] and tieredkv.samples["evict"]

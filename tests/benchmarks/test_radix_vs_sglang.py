"""benchmarks/radix_vs_sglang.py still drives the engine's RequestPages (tieredkv alone)."""

from benchmarks import radix_vs_sglang as bench


def test_the_trace_replays_with_evictions_and_a_sound_cache() -> None:
    trace = bench.make_trace(seed=0, users=4, rounds=3)
    assert trace == bench.make_trace(seed=0, users=4, rounds=3)  # seeded
    assert all(2500 <= len(turn.prompt) <= 3400 for turn in trace)
    systems = bench.replay(trace, num_pages=600, sg=None)  # checks integrity at the end
    tieredkv = systems["tieredkv"]
    assert tieredkv.hit_tokens > 0 and tieredkv.evicted_pages > 0
    assert len(tieredkv.samples["match"]) == 2 * len(trace)
    assert tieredkv.samples["insert"] and tieredkv.samples["evict"]

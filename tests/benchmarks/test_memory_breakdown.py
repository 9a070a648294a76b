"""The smaps breakdown: this process's own mappings, grouped by kind."""

import mmap
import os

from benchmarks.memory_breakdown import KINDS, MemorySampler, breakdown, tree_breakdown

MIB = 1 << 20


def _vm_rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_the_kinds_add_up_to_the_resident_total() -> None:
    kinds = breakdown(os.getpid())
    assert set(kinds) == set(KINDS)
    assert kinds["libraries"] > 0 and kinds["anonymous"] + kinds["heap"] > 0
    assert abs(sum(kinds.values()) - _vm_rss_bytes()) < 16 * MIB  # [vdso] and reads apart


def test_a_shared_anonymous_buffer_counts_as_shared_anonymous() -> None:
    before = breakdown(os.getpid())["shared_anonymous"]
    region = mmap.mmap(-1, 32 * MIB)  # MAP_SHARED: the host tier's kind of buffer
    region.write(b"x" * (32 * MIB))
    try:
        assert breakdown(os.getpid())["shared_anonymous"] - before >= 32 * MIB
    finally:
        region.close()


def test_the_sampler_keeps_the_highest_sample() -> None:
    with MemorySampler(os.getpid()) as sampler:
        region = mmap.mmap(-1, 32 * MIB)
        region.write(b"x" * (32 * MIB))
    region.close()
    assert sampler.peak["shared_anonymous"] >= 32 * MIB
    assert sum(tree_breakdown(os.getpid()).values()) < sum(sampler.peak.values())

"""benchmarks/vllm_compare/tiers.py: a disk turn is judged from the client's bytes (the
history's tokens floored to pages, times the page's bytes), whatever the server reports; the
server's count of disk tokens is only cross-checked."""

from __future__ import annotations

import pytest
import torch

from benchmarks.vllm_compare.tiers import judge
from tieredkv.cache.page_layout import PageLayout

# the default model's shape in bf16: 368,640 bytes a 16-token page
LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=torch.bfloat16)


def row(history_tokens: int, disk_ms: float, device_ms: float, server_disk_tokens: int) -> dict:
    return {
        "history_tokens": history_tokens,
        "disk_ttft_s": disk_ms / 1000,
        "device_ttft_s": device_ms / 1000,
        "disk_cached_by_tier": {"device": 0, "host": 0, "disk": server_disk_tokens},
    }


def test_the_bound_comes_from_the_clients_bytes() -> None:
    # 3,080 tokens floor to 192 pages: 70,778,880 bytes; at 1 GB/s a 70.8 ms ideal read
    judged = judge(row(3080, 200, 100, 3072), LAYOUT, 1e9)
    assert judged["disk_bytes"] == 192 * 368_640
    assert judged["bound_s"] == pytest.approx(0.1 + 1.5 * 0.07077888)
    assert judged["met"] and judged["server_count_matches"]  # 200 ms within 206.2 ms
    assert not judge(row(3080, 210, 100, 3072), LAYOUT, 1e9)["met"]


def test_a_server_reporting_fewer_disk_tokens_changes_nothing_but_the_cross_check() -> None:
    honest = judge(row(3072, 150, 100, 3072), LAYOUT, 1e9)
    short = judge(row(3072, 150, 100, 1024), LAYOUT, 1e9)
    assert short["bound_s"] == honest["bound_s"] and short["met"] == honest["met"]
    assert honest["server_count_matches"] and not short["server_count_matches"]
    assert short["server_disk_tokens"] == 1024

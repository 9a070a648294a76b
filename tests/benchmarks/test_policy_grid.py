"""benchmarks/policy_grid.py: the grid's cells and how the best one is picked (no servers)."""

import pytest

from benchmarks.policy_grid import grid_specs, grid_summary, main
from tieredkv.bench.suite import ServerSpec


def fake_run(policy: str, page_size: int, ttft_s: float | None, hit: float, errors: int = 0):
    tiers = {"device": hit / 2, "host": 0.0, "disk": hit / 2}
    summary = {"ttft_s": {"p50": ttft_s}, "hit_ratio": hit, "hit_ratio_by_tier": tiers}
    return {
        "spec": {"write_policy": policy, "page_size": page_size},
        "summary": {"reuse_rounds": {**summary, "errors": errors}, "overall": None},
    }


def test_every_policy_at_every_page_size() -> None:
    specs = grid_specs(ServerSpec("tieredkv", "192MiB", "64MiB", "4GiB"), (8, 16))
    cells = {(s.write_policy, s.page_size) for s in specs}
    assert cells == {(p, n) for p in ("write_back", "write_through") for n in (8, 16)}
    assert all((s.device_cache, s.host_cache, s.disk_cache) == ("192MiB", "64MiB", "4GiB")
               for s in specs)  # fmt: skip


def test_the_best_cell_is_the_fastest_without_errors() -> None:
    runs = [
        fake_run("write_back", 16, 0.150, 0.9),
        fake_run("write_through", 16, 0.140, 0.8),
        fake_run("write_through", 8, 0.140, 0.9),  # as fast, more hits: wins the tie
        fake_run("write_back", 8, 0.100, 0.9, errors=1),  # fastest, but it failed requests
        fake_run("write_back", 32, None, 0.0),  # unknown
    ]
    summary = grid_summary(runs)
    assert summary["best"] == {"write_policy": "write_through", "page_size": 8}
    assert len(summary["cells"]) == 5
    assert "| write_through | 8 | 140 |" in summary["table"]


def test_bad_page_sizes_are_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--page-sizes", "16,x"])
    assert exit_info.value.code == 2

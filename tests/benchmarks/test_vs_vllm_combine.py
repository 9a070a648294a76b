"""benchmarks/vs_vllm.py's `--combine` on hand-made reports: the tiers turns of every run, each
judged by its own run; the overflow p50 the median of the runs' (the real runs start vLLM and
the default model, too slow for the suite)."""

from __future__ import annotations

from benchmarks.vs_vllm import combine, targets_table


def tiers(limit_gb_s: float, disk_ms: list[float], bound_ms: list[float]) -> dict:
    turns = [
        {"disk_ttft_s": d / 1000, "bound_s": b / 1000, "met": d <= b}
        for d, b in zip(disk_ms, bound_ms, strict=True)
    ]
    return {"disk_read": {"bytes_per_s": limit_gb_s * 1e9}, "turns": turns}


def overflow(ours_ms: float, theirs_ms: float) -> dict:
    return {
        "tieredkv": {"summary": {"ttft_p50_s": ours_ms / 1000}},
        "vllm": {"summary": {"ttft_p50_s": theirs_ms / 1000}},
    }


def test_combine_keeps_every_runs_turns_and_the_median_overflow() -> None:
    reports = [
        {"tiers": tiers(2.0, [180, 190], [200, 185]), "overflow": overflow(150, 4300)},
        {"tiers": tiers(1.5, [170], [175]), "overflow": overflow(160, 4500)},
        {"overflow": overflow(900, 4400)},  # a run without the tiers part
    ]
    combined = combine(reports)
    assert len(combined["tiers"]["turns"]) == 3
    assert combined["tiers"]["disk_read"]["runs_bytes_per_s"] == [2.0e9, 1.5e9]
    ours = combined["overflow"]["tieredkv"]["summary"]
    assert ours["ttft_p50_s"] == 0.16 and ours["runs_ttft_p50_s"] == [0.15, 0.16, 0.9]
    assert combined["overflow"]["vllm"]["summary"]["ttft_p50_s"] == 4.4

    table = targets_table(combined)
    assert "(2 of 3 within)" in table and "median 1.75 GB/s (1.50-2.00)" in table
    overflow_row = next(line for line in table.splitlines() if "3.7x the KV budget" in line)
    assert "160 ms (150-900)" in overflow_row and "4,400 ms (4,300-4,500)" in overflow_row
    assert "27.5x lower" in overflow_row and overflow_row.endswith("| yes |")


def test_one_runs_overflow_shows_no_range_and_a_miss_says_no() -> None:
    table = targets_table(combine([{"overflow": overflow(1000, 4000)}]))
    row = next(line for line in table.splitlines() if "3.7x the KV budget" in line)
    assert "| 1,000 ms | 4,000 ms | 4.0x lower |" in row and row.endswith("| NO |")

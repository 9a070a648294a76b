"""`tieredkv bench tiers --out` writes a result file, and benchmarks/tier_bandwidth.py renders
result files into its docs section: medians over runs with (min-max), beside the limits."""

import json
from pathlib import Path

from benchmarks.tier_bandwidth import render_markdown
from tieredkv.bench import tiers
from tieredkv.bench.result_file import load_results, machine_line, write_result


def test_tiers_writes_a_result_that_renders(tmp_path: Path) -> None:
    root = tmp_path / "results"
    out = root / "tier_bandwidth" / "run-1"
    argv = ["--quick", "--memory-only", "--dir", str(tmp_path), "--out", str(out)]
    assert tiers.main(argv) == 0
    first = json.loads((out / "result.json").read_text())
    assert first["benchmark"] == "tier_bandwidth"
    assert first["command"][:3] == ["tieredkv", "bench", "tiers"]
    assert {r["path"] for r in first["records"]} == {"host->device", "device->host"}
    assert first["summary"]["limits"]["memcpy_2t_gbps"] > 0

    # two more runs: every figure scaled by 2 and by 3, so the median run is the x2 one
    for row in first["records"]:
        assert row["gbps_min"] <= row["gbps"] <= row["gbps_max"]
    for scale in (2, 3):
        records = [
            r | {key: r[key] * scale for key in ("gbps", "gbps_min", "gbps_max")}
            for r in first["records"]
        ]
        write_result(root / "tier_bandwidth" / f"run-{scale}", "tier_bandwidth",
                     settings=first["settings"], summary=first["summary"], records=records,
                     argv=first["command"])  # fmt: skip
    results = load_results(root)["tier_bandwidth"]
    page = render_markdown(results)
    assert page == render_markdown(results)  # deterministic
    assert page.startswith("## Tier bandwidth")
    assert machine_line(first) in page
    for name in ("run-1", "run-2", "run-3"):
        assert f"`tier_bandwidth/{name}`" in page
    for row in first["records"]:
        # the median of the runs' medians, the slowest and the fastest repetition of any run
        g, low, high = row["gbps"], row["gbps_min"], 3 * row["gbps_max"]
        cell = f"| {2 * g:.2f} ({low:.2f}-{high:.2f}) | {row['limit']} |"
        assert cell in page, (cell, page)
    assert "p99" not in page

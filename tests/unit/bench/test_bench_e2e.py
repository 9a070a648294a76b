"""`tieredkv bench multiturn` end to end: it starts a real `tieredkv serve` (the default model,
fp32, tiny tiers so one conversation's history is demoted to disk) and its `--no-cache`
baseline, drives 2 users x 2 rounds, and writes the report. No timed assertions."""

import json
import os
from pathlib import Path

from benchmarks import check_equal, plots
from tieredkv.cli import main as cli_main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# fp32 pages: 737,280 B per 16 tokens. 24 MiB = 34 pages = 544 tokens >= --max-model-len 512,
# less than the two conversations together (~350 tokens each): one goes to disk.
TINY = ["--users", "2", "--rounds", "2", "--system-words", "40", "--document-words", "150",
        "--max-tokens", "8", "--dtype", "float32", "--max-model-len", "512",
        "--device-cache-size", "24MiB", "--host-cache-size", "0", "--disk-cache-size", "256MiB",
        "--threads", "1"]  # fmt: skip


def accepts_o_direct(directory: Path) -> bool:
    """Whether this filesystem lets a file be opened with O_DIRECT (tmpfs refuses)."""
    probe = directory / "o-direct-probe"
    try:
        os.close(os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    return True


def test_managed_run_with_baseline_and_check_equal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [*TINY, "--out", str(out)]
    assert cli_main(["bench", "multiturn", *argv, "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads((out / "report.json").read_text())
    cached, baseline = report["runs"]
    assert (cached["label"], baseline["label"]) == ("tieredkv", "recompute")
    assert report["baseline_label"] == "recompute"
    assert all(r["error"] is None for run in report["runs"] for r in run["records"])
    assert all(r["ttft_s"] is not None and r["output_tokens"] for r in cached["records"])

    reuse = cached["summary"]["reuse_rounds"]
    assert reuse["hit_ratio"] > 0.5  # round 1 reuses the conversation so far
    assert sum(reuse["hit_ratio_by_tier"].values()) == reuse["hit_ratio"]
    assert reuse["hit_ratio_by_tier"]["disk"] > 0
    assert cached["promotion"]["disk"]["count"] > 0
    assert cached["promotion"]["disk"]["p50_s"] is not None
    assert cached["transfer_bytes"]["disk->device"] > 0  # no host tier: straight up
    assert cached["promotion"]["disk"]["bytes_moved"] > 0
    # the disk stores live under --work-dir: O_DIRECT exactly where its filesystem allows
    assert cached["direct_io"] is accepts_o_direct(tmp_path / "work")
    assert len(cached["page_cache_dropped_bytes"]) == 2  # before each round
    assert baseline["summary"]["overall"]["hit_ratio"] == 0.0  # --no-cache: known zero

    # fp32: the cached run's greedy outputs equal the recompute baseline's
    assert check_equal.main([str(out)]) == 0
    equal = json.loads((out / "check_equal.json").read_text())
    assert equal["dtype"] == "float32" and equal["compared"] == 4
    assert equal["identical"], equal["differences"]
    assert report["disk"]["bytes_per_s"] > 0
    targets = report["targets"]
    assert targets["server_check"]["cached_over_history"] == []  # the server agrees
    assert targets["ttft_within_bound"]["kv_bytes_per_page"] == 737_280  # fp32 pages
    drawn = plots.draw(out)
    assert len(drawn) == 3
    for path in drawn:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert "| tieredkv |" in (out / "summary.md").read_text()

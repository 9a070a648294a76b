"""benchmarks/capacity_sweep.py: its flag, and one tiny sweep of two real `tieredkv serve`
configurations through `bench multiturn`'s managed runs (what ran, never how fast)."""

import json
from pathlib import Path

import pytest

from benchmarks import capacity_sweep
from benchmarks.capacity_sweep import parse_sweep
from tieredkv.errors import ConfigError

TINY = ["--users", "2", "--rounds", "2", "--system-words", "40", "--document-words", "60",
        "--max-tokens", "4", "--dtype", "float32", "--max-model-len", "512",
        "--disk-cache-size", "0", "--threads", "1", "--no-baseline"]  # fmt: skip


def test_sweep_flag_parsing() -> None:
    assert parse_sweep("192MiB:0, 256MiB:1GiB") == [("192MiB", "0"), ("256MiB", "1GiB")]
    with pytest.raises(ConfigError, match="DEVICE:HOST"):
        parse_sweep("192MiB")
    with pytest.raises(ConfigError):
        parse_sweep("192MiB:lots")
    for argv in (["--sweep", "nonsense"], ["--sweep", "1GiB:0", "--base-url", "http://x"], []):
        with pytest.raises(SystemExit) as exit_info:
            capacity_sweep.main(argv)
        assert exit_info.value.code == 2


def test_two_sizes_run_and_make_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [*TINY, "--sweep", "24MiB:0,32MiB:16MiB", "--out", str(out)]
    assert capacity_sweep.main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [run["label"] for run in report["runs"]] == ["tieredkv 24MiB+0", "tieredkv 32MiB+16MiB"]
    assert [run["spec"]["host_cache"] for run in report["runs"]] == ["0", "16MiB"]
    for run in report["runs"]:
        assert all(r["error"] is None for r in run["records"])
        assert run["summary"]["reuse_rounds"]["hit_ratio"] > 0  # round 1 reuses round 0
    summary = (out / "summary.md").read_text()
    assert "## Capacity sweep" in summary and "| 32MiB | 16MiB |" in summary

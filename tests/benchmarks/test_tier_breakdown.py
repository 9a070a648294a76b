"""benchmarks/tier_breakdown.py on tiny sizes: every stage timed (never a timed assertion)."""

import json
import math
from pathlib import Path

from benchmarks.tier_breakdown import main


def test_every_stage_and_alternative_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.json"
    assert main(["--quick", "--dir", str(tmp_path), "--json", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["breakdown.json"]  # temp files are gone
    report = json.loads(out.read_text())
    assert report["batch_pages"] == 16 and report["memcpy_gbps"] > 0
    stages = report["gbps"]
    for name in ("job host->device", "job device->host", "job host->disk", "job disk->host"):
        assert name in stages
    assert "alt: the job's copy on 1 thread host->device" in stages
    for callers in (1, 2):  # the store alone, its pages read back verified
        assert f"store alone, {callers} caller(s), read" in stages
    assert all(math.isfinite(gbps) and gbps > 0 for gbps in stages.values())


def test_memory_only_times_no_disk_stage(tmp_path: Path) -> None:
    out = tmp_path / "breakdown.json"
    assert main(["--quick", "--memory-only", "--dir", str(tmp_path), "--json", str(out)]) == 0
    stages = json.loads(out.read_text())["gbps"]
    assert stages and not any("disk" in name for name in stages)

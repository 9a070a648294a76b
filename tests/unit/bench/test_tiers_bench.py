"""`tieredkv bench tiers` on tiny sizes: the report's shape and sane values (never timings)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tieredkv.bench import tiers
from tieredkv.bench.tier_copies import make_transfer_jobs, memory_gbps, transfer_disk_gbps
from tieredkv.bench.tier_limits import raw_disk_gbps
from tieredkv.bench.tier_store import LAYOUT
from tieredkv.cache.disk.store import DiskStore
from tieredkv.cache.tier import Tier
from tieredkv.cache.transfer.layout_copy import SPLIT_MIN_PAGES

PATHS = {"host->device", "device->host", "host->disk", "disk->host"}


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("tiers")
    out = tmp / "report.json"
    assert tiers.main(["--quick", "--dir", str(tmp), "--json", str(out)]) == 0
    assert [p.name for p in tmp.iterdir()] == ["report.json"]  # temp files are gone
    return json.loads(out.read_text())


def test_limits_are_measured(report: dict) -> None:
    limits = report["limits"]
    for name in ("memcpy_gbps", "memcpy_2t_gbps", "xxh3_gbps", "raw_write_gbps", "raw_read_gbps"):
        assert positive(limits[name]), name
    raw = limits["raw_patterns"]
    assert raw and limits["raw_read_gbps"] == max(r["read_gbps"] for r in raw)
    assert isinstance(report["store_direct_io"], bool)


def test_every_path_and_batch_has_a_verified_row(report: dict) -> None:
    rows = report["rows"]
    transfer_queue = [r for r in rows if r["via"].startswith("TransferJobs")]
    assert {(r["path"], r["batch_pages"]) for r in transfer_queue} == {
        (path, batch) for path in PATHS for batch in (4, 16)
    }
    assert all(r["via"].startswith("TransferJobs") for r in rows)  # what the server runs
    for row in rows:
        assert row["verified"], row
        assert positive(row["gbps"]) and positive(row["limit_gbps"])
        assert row["gbps_min"] <= row["gbps"] <= row["gbps_max"]
        assert row["share"] == pytest.approx(row["gbps"] / row["limit_gbps"])
        assert row["meets_target"] == (row["share"] >= row["target"])
        want = "memcpy" if "device" in row["path"] else "raw disk"
        assert row["limit"].startswith(want)


def test_memory_rows_are_judged_at_the_parallelism_they_copied_at(report: dict) -> None:
    memcpy = {1: report["limits"]["memcpy_gbps"], 2: report["limits"]["memcpy_2t_gbps"]}
    memory = [r for r in report["rows"] if "device" in r["path"]]
    assert len(memory) == 2 * 2  # 2 paths x 2 batches, as the server runs them
    assert {r["threads"] for r in memory} == {1, 2}  # batch 4 alone, batch 16 split
    for row in memory:
        threads = 2 if row["batch_pages"] >= SPLIT_MIN_PAGES else 1
        assert row["threads"] == threads, row
        assert row["limit"] == f"memcpy {threads} thread(s)"
        assert row["limit_gbps"] == memcpy[threads]
    for row in report["rows"]:
        if "disk" in row["path"]:
            assert row["threads"] is None


def test_memory_only_measures_no_disk(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "report.json"
    assert tiers.main(["--quick", "--memory-only", "--dir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["limits"]) == {"memcpy_gbps", "memcpy_2t_gbps"}
    assert {r["path"] for r in report["rows"]} == {"host->device", "device->host"}
    assert all(r["verified"] for r in report["rows"]) and report["store_direct_io"] is None
    assert "store O_DIRECT n/a" in capsys.readouterr().out


def test_memory_jobs_move_the_right_bytes() -> None:
    transfer_jobs = make_transfer_jobs(8, None, seed=1)
    to_device, to_host, ok = memory_gbps(transfer_jobs, 4, 2, np.random.default_rng(0))
    assert ok and positive(to_device.gbps) and positive(to_host.gbps)
    assert to_device.min_gbps <= to_device.gbps <= to_device.max_gbps
    # the same job the transfer queue runs: a host page lands in the layer-major device pool
    transfer_jobs.host_pool.kv[5] = 2.5
    transfer_jobs.job(Tier.HOST, Tier.DEVICE, [5], [3], [])()
    assert bool((transfer_jobs.device_pool.kv[:, :, 3] == 2.5).all())


def test_disk_jobs_read_back_what_they_wrote(tmp_path: Path) -> None:
    store = DiskStore(tmp_path / "store", b"bench", LAYOUT, 16 * LAYOUT.page_bytes + (4 << 20))
    try:
        transfer_jobs = make_transfer_jobs(8, store, seed=2)
        before = transfer_jobs.host_pool.kv.clone()
        write, read, ok = transfer_disk_gbps(transfer_jobs, store, 4, 1, np.random.default_rng(0))
        assert ok and positive(write.gbps) and positive(read.gbps)
        assert store.num_free == store.num_pages  # the benchmark gave its slots back
        assert torch.equal(transfer_jobs.host_pool.kv.view(torch.int16), before.view(torch.int16))
    finally:
        store.close()


def test_raw_disk_removes_its_file(tmp_path: Path) -> None:
    result = raw_disk_gbps(tmp_path / "raw.bin", 4 << 20, 1, np.random.default_rng(0), 1, 2)
    assert positive(result.write_gbps) and positive(result.read_gbps)
    assert not (tmp_path / "raw.bin").exists()


def test_a_missing_dir_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert tiers.main(["--quick", "--dir", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("tieredkv bench tiers: error: ")


def test_bad_batches_are_refused() -> None:
    with pytest.raises(SystemExit) as exit_info:
        tiers.main(["--batches", "64,zero"])
    assert exit_info.value.code == 2

"""Report shape and tables, from fake-server runs."""

import json
from pathlib import Path

from bench_fakes import FakeServer

from tieredkv.bench import report as reports
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.bench.workload_run import run_workload

SMALL = WorkloadConfig(num_users=2, num_rounds=2, system_words=10, document_words=20, max_tokens=8)


def two_runs(answer_prefix: str = "Answer") -> tuple[dict, dict]:
    arrival = ArrivalConfig(1)
    cached = run_workload("http://a", Workload(SMALL), arrival, label="tieredkv",
                          transport=FakeServer(True).transport())  # fmt: skip
    plain = FakeServer(False, answer_prefix)
    baseline = run_workload("http://b", Workload(SMALL), arrival, label="recompute",
                            transport=plain.transport())  # fmt: skip
    return cached, baseline


def test_report_json_and_tables(tmp_path: Path) -> None:
    cached, baseline = two_runs()
    report = reports.new_report(["--quick"], SMALL, ArrivalConfig(1))
    report["runs"] = [cached, baseline]
    report["baseline_label"] = "recompute"
    report["sections"]["A script's own"] = "| its | table |"
    text = reports.finish(report, tmp_path)
    assert "## A script's own\n\n| its | table |" in text
    loaded = json.loads((tmp_path / "report.json").read_text())
    assert loaded["version"] == 3
    assert loaded["machine"]["cores"] >= 1 and "Machine: " in text
    assert loaded["workload"]["num_users"] == 2
    assert loaded["arrival"]["mode"] == "round_robin"
    assert [r["label"] for r in loaded["runs"]] == ["tieredkv", "recompute"]
    run = loaded["runs"][0]
    assert set(run["summary"]) == {"overall", "reuse_rounds", "by_round"}
    assert len(run["summary"]["by_round"]) == 2
    assert run["records"][0]["cached_by_tier"] == {
        "device": 0,
        "host": 0,
        "disk": 0,
        "remote": None,
    }
    assert loaded["runs"][1]["summary"]["overall"]["hit_ratio"] is None  # JSON null
    assert "unknown" in text  # the plain server's hit ratios
    assert "| tieredkv |" in text
    assert "n<100" in text  # 2 requests a round: no p99


def test_every_table_row_has_as_many_cells_as_its_header() -> None:
    from benchmarks.capacity_sweep import sweep_table
    from tieredkv.bench import tables

    cached, baseline = two_runs()
    cached["spec"] = {"device_cache": "64MiB", "host_cache": "32MiB"}
    for text in (tables.runs_table([cached, baseline], baseline), tables.rounds_table(cached),
                 sweep_table([cached], baseline)):  # fmt: skip
        widths = {line.count("|") for line in text.splitlines()}
        assert len(widths) == 1, text
        assert "hit remote" in text

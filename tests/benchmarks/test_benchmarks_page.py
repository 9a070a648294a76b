"""docs/benchmarks.md is a function of benchmarks/results/ alone: the committed page equals a
fresh render, and the render is built from the result files the benchmarks write."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from benchmarks import bench_report
from tieredkv.bench.result_file import load_results, machine_info, machine_line, write_result


def test_the_committed_page_equals_a_fresh_render() -> None:
    assert bench_report.REPORT_PATH.read_text() == bench_report.render(), (
        "docs/benchmarks.md is stale or edited by hand: run `make bench-report`"
    )


def test_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "benchmarks.md"
    stale.write_text("# edited by hand\n")
    empty = tmp_path / "results"
    empty.mkdir()
    assert bench_report.main(["--results", str(empty), "--out", str(stale), "--check"]) == 1
    assert bench_report.main(["--results", str(empty), "--out", str(stale)]) == 0
    assert bench_report.main(["--results", str(empty), "--out", str(stale), "--check"]) == 0


def test_a_result_round_trips_with_its_machine_and_command(tmp_path: Path) -> None:
    path = write_result(
        tmp_path / "toy" / "run",
        "toy",
        settings={"repeats": 3},
        summary={"ttft_s": 0.25},
        records=[{"ttft_s": 0.2}, {"ttft_s": 0.3}],
        peers={"vllm": {"version": "1.0"}},
        argv=["toy.py", "--repeats", "3"],
    )
    result = json.loads(path.read_text())
    assert result["command"] == ["toy.py", "--repeats", "3"]
    assert result["machine"] == machine_info()
    assert result["records"] == [{"ttft_s": 0.2}, {"ttft_s": 0.3}]
    assert result["peers"]["vllm"]["version"] == "1.0"
    cpu = Path("/proc/cpuinfo").read_text()
    assert result["machine"]["cpu_model"] in cpu
    assert result["machine"]["cpu_model"] in machine_line(result)


def test_results_group_by_benchmark_in_order_of_date(tmp_path: Path) -> None:
    for folder, benchmark, date in (
        ("b/2", "b", "2026-01-02T00:00:00Z"),
        ("a/1", "a", "2026-01-03T00:00:00Z"),
        ("b/1", "b", "2026-01-01T00:00:00Z"),
    ):
        path = write_result(tmp_path / folder, benchmark, settings={}, summary={}, records=[])
        result = json.loads(path.read_text())
        result["date"] = date
        path.write_text(json.dumps(result))
    grouped = load_results(tmp_path)
    assert list(grouped) == ["a", "b"]
    assert [result["dir"] for result in grouped["b"]] == ["b/1", "b/2"]


def test_each_benchmark_renders_its_own_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def render_markdown(results: list[dict]) -> str:
        seen.append([result["dir"] for result in results])
        return f"## Toy\n\n{len(results)} runs, first {results[0]['summary']['x']}\n"

    module = types.ModuleType("benchmarks.toy_bench")
    module.render_markdown = render_markdown  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.toy_bench", module)
    for run, x in (("r1", 1), ("r2", 2)):
        write_result(tmp_path / run, "toy_bench", settings={}, summary={"x": x}, records=[])
    page = bench_report.render(tmp_path)
    assert page.startswith(bench_report.HEADER)
    assert "## Toy\n\n2 runs, first 1\n" in page
    assert seen == [["r1", "r2"]]

"""benchmarks/radix_vs_sglang.py: the replay drives the engine's RequestPages, the result file
holds every sample, and the docs section is built from those samples alone (SGLang's columns
only where SGLang's samples are present)."""

import importlib.util
import json
from pathlib import Path

import pytest

from benchmarks import radix_vs_sglang as bench
from benchmarks.radix.replay_trace import make_trace
from benchmarks.radix.sglang_replay import SglangMissingError, load_sglang
from benchmarks.radix.vs_sglang_report import render_markdown, summarise
from tieredkv.bench.result_file import load_results, write_result

SMALL = ["--users", "4", "--rounds", "3", "--device-pages", "600", "--runs", "2"]
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def test_the_trace_replays_with_evictions_and_a_sound_cache() -> None:
    trace = make_trace(seed=0, users=4, rounds=3)
    assert trace == make_trace(seed=0, users=4, rounds=3)  # seeded
    assert all(2500 <= len(turn.prompt) <= 3400 for turn in trace)
    systems = bench.replay(trace, num_pages=600, sg=None)  # checks integrity at the end
    tieredkv = systems["tieredkv"]
    assert tieredkv.hit_tokens > 0 and tieredkv.evicted_pages > 0
    assert len(tieredkv.samples["match"]) == 2 * len(trace)
    assert tieredkv.samples["insert"] and tieredkv.samples["evict"]


def test_without_sglang_the_result_and_report_say_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--no-sglang", *SMALL, "--out", str(tmp_path / "run")]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["benchmark"] == "radix_vs_sglang" and result["peers"] == {}
    assert sorted({r["system"] for r in result["records"]}) == ["limit", "tieredkv"]
    trace = make_trace(seed=0, users=4, rounds=3)
    for record in result["records"]:
        if record["system"] == "tieredkv":  # every call's sample: 2 matches a turn
            assert len(record["samples_ns"]["match"]) == 2 * len(trace)
            assert record["prompt_tokens"] == sum(len(t.prompt) for t in trace)
    assert result["summary"] == json.loads(json.dumps(summarise(result["records"])))
    printed = capsys.readouterr().out
    assert "SGLang: not measured in this run." in printed
    assert "SGLang 0" not in printed and "sglang" not in result["summary"]


@pytest.mark.skipif(HAS_SGLANG, reason="SGLang is installed in this interpreter")
def test_a_missing_sglang_is_a_message_not_a_result(tmp_path: Path) -> None:
    with pytest.raises(SglangMissingError, match=r"sglang_radix\.sh install"):
        load_sglang()
    assert bench.main([*SMALL, "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def _record(run: int, system: str, match_us: list[float], **counts: int) -> dict:
    samples = {"match": [int(us * 1000) for us in match_us]}
    if system != "limit":
        samples |= {"insert": [20_000, 22_000], "evict": [9_000, 11_000]}
        counts = {"prompt_tokens": 1000, "hit_tokens": 400, "evicted_pages": 10} | counts
    return {"run": run, "system": system, "samples_ns": samples, **counts}


def _write(root: Path, records: list[dict], peers: dict) -> dict:
    write_result(
        root / "radix_vs_sglang" / "2026-01-01T0000",
        "radix_vs_sglang",
        settings={
            "users": 4,
            "rounds": 3,
            "device_pages": 600,
            "runs": 2,
            "page_size": 16,
            "prompt_len_min": 2534,
            "prompt_len_max": 2807,
            "limit_prompt_len": 2644,
        },
        summary=summarise(records),
        records=records,
        peers=peers,
        argv=["benchmarks/sglang_radix.sh", "run"],
    )
    return load_results(root)["radix_vs_sglang"][0]


def test_the_section_shows_the_measured_samples(tmp_path: Path) -> None:
    records = [
        _record(0, "tieredkv", [10.0 + i / 100 for i in range(100)]),  # p50 10.495, p99 10.99
        _record(1, "tieredkv", [12.0 + i / 100 for i in range(100)]),
        _record(0, "sglang", [30.0, 31.0, 32.0], evicted_pages=40),
        _record(1, "sglang", [34.0, 36.0, 38.0], evicted_pages=40),
        _record(0, "limit", [0.2, 0.2, 0.3]),
        _record(1, "limit", [0.4, 0.4, 0.5]),
    ]
    result = _write(tmp_path, records, {"sglang": {"version": "0.5.23"}})
    page = render_markdown([result])
    assert page.startswith("## ") and page == render_markdown([result])  # deterministic
    assert "SGLang 0.5.23 (`RadixCache`, LRU, on CPU) measured in the same runs." in page
    assert "### `radix_vs_sglang/2026-01-01T0000`" in page
    row = next(line for line in page.splitlines() if line.startswith("| match |"))
    # tieredkv p50, p99 (100 samples a run); SGLang p50, no p99 from 3; limit; calls
    assert row == (
        "| match | 11.5 (10.5-12.5) | 12 (11-13) | 33.5 (31.0-36.0) | — "
        "| 0.30 (0.20-0.40) | 100 / 3 |"
    )
    per_page = next(line for line in page.splitlines() if line.startswith("| evict, per"))
    assert "2.00 (2.00-2.00)" in per_page and "0.50 (0.50-0.50)" in per_page  # 20 µs / pages


def test_no_sglang_column_without_its_samples(tmp_path: Path) -> None:
    records = [_record(run, "tieredkv", [10.0, 11.0, 12.0]) for run in (0, 1)]
    result = _write(tmp_path, records, {"sglang": {"version": "0.5.23"}})  # named, not measured
    page = render_markdown([result])
    assert "SGLang: not measured in this run." in page
    header = next(line for line in page.splitlines() if line.startswith("| call |"))
    assert "SGLang" not in header
    assert "| match | 11.0 (11.0-11.0) | — | — | 3 |" in page


@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang runs in .venv-sglang (sglang_radix.sh)")
def test_both_trees_replay_the_same_trace() -> None:
    trace = make_trace(seed=0, users=4, rounds=3)
    systems = bench.replay(trace, num_pages=600, sg=load_sglang())
    sglang = systems["sglang"]
    assert len(sglang.samples["match"]) == 2 * len(trace)
    assert sglang.hit_tokens > 0 and sglang.evicted_pages > 0 and sglang.samples["insert"]

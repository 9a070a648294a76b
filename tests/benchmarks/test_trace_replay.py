"""The trace replay's parts without servers: conversation selection and scaling, the trace's
own reuse maximum, reading vLLM's client result and server counters, and the report."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from benchmarks import bench_report, trace_replay
from benchmarks.trace_compare import replay, scaling
from benchmarks.trace_compare.report import render_markdown
from tieredkv.bench.prom_text import parse_samples
from tieredkv.bench.result_file import write_result


def row(ms: int, hash_ids: list[int], input_length: int, output_length: int = 40) -> dict:
    return {
        "timestamp": ms,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": hash_ids,
    }


# two conversations sharing only the first block; the third turn extends the first's
ROWS = [
    row(1000, [0, 1, 2], 1400),
    row(2000, [0, 7, 8], 1500),
    row(3000, [0, 1, 2, 3, 4], 2300),
    row(9000, [0, 9], 900),  # a third conversation, first turn after a 5 s window
]


def test_conversations_follow_extended_prefixes() -> None:
    assert scaling.conversation_ids(ROWS) == [0, 1, 0, 2]


def test_selection_keeps_whole_conversations_started_in_the_window() -> None:
    config = scaling.ScalingConfig(start_window_s=5, every=1)
    assert scaling.select(ROWS, config) == ROWS[:3]
    every_second = scaling.ScalingConfig(start_window_s=5, every=2)
    assert scaling.select(ROWS, every_second) == [ROWS[0], ROWS[2]]


def test_scaling_divides_lengths_and_shifts_time() -> None:
    config = scaling.ScalingConfig(output_divisor=16, output_cap=2)
    scaled = scaling.scale([row(1000, [0, 1], 1000, 5), row(4000, [0, 1, 2], 1025, 99)], config)
    assert [r["timestamp"] for r in scaled] == [0, 3000]
    assert [r["input_length"] for r in scaled] == [32, 33]  # ceil(n / 32)
    assert [r["output_length"] for r in scaled] == [1, 2]  # at least 1, at most the cap
    assert scaled[1]["hash_ids"] == [0, 1, 2]


def test_trace_max_counts_whole_pages_an_earlier_prompt_began_with() -> None:
    rows = [
        row(0, [0, 1, 2], 40),  # chunks of 16, 16, 8 tokens
        row(1, [0, 1, 2, 3], 64),  # block 2 is whole here: a different chunk from the 8 above
        row(2, [0, 1, 2, 3], 64),  # all of it, less the last token
        row(3, [0, 5], 32),
    ]
    assert scaling.trace_max_hit_tokens(rows, 16, 16) == [0, 32, 63, 16]
    assert scaling.trace_max_hit_tokens(rows, 16, 32) == [0, 32, 63, 0]


def test_committed_trace_matches_its_meta() -> None:
    meta = json.loads(scaling.SCALED_META.read_text())
    rows = scaling.read_trace(scaling.SCALED_TRACE)
    assert len(rows) == meta["requests"]
    assert sum(r["input_length"] for r in rows) == meta["prompt_tokens"]
    hits = scaling.trace_max_hit_tokens(rows, 16, meta["page_size"])
    assert sum(hits) == meta["trace_max_hit_tokens"]
    assert 0.40 <= meta["trace_max_hit_tokens"] / meta["prompt_tokens"] <= 0.55


def saved_client_result() -> dict:
    """The fields of `vllm bench serve --save-result --save-detailed` that the replay reads."""
    return {
        "duration": 10.0,
        "completed": 2,
        "failed": 1,
        "request_throughput": 0.2,
        "request_goodput": 0.1,
        "max_concurrent_requests": 3,
        "total_input_tokens": 600,
        "input_lens": [100, 200, 300],
        "output_lens": [5, 7, 0],
        "ttfts": [0.5, 1.5, 0.0],
        "errors": ["", "", "Bad Request"],
        "median_ttft_ms": 1000.0,
        "p90_ttft_ms": 1400.0,
        "median_tpot_ms": 50.0,
        "median_e2el_ms": 2000.0,
        "p90_e2el_ms": 3000.0,
    }


def test_client_result_is_read_in_seconds() -> None:
    raw = saved_client_result()
    summary = replay.client_summary(raw)
    assert summary["ttft_p50_s"] == 1.0 and summary["ttft_p90_s"] == 1.4
    assert summary["tpot_p50_s"] == 0.05 and summary["e2e_p90_s"] == 3.0
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["client_prompt_tokens"] == 600
    requests = replay.client_requests(raw)
    assert requests[2] == {
        "prompt_tokens": 300,
        "output_tokens": 0,
        "ttft_s": None,
        "error": "Bad Request",
    }


def test_reused_tokens_from_either_servers_counters() -> None:
    before = parse_samples('tieredkv_cache_hit_tokens_total{tier="device"} 10\n')
    before.update(parse_samples("tieredkv_prompt_tokens_total 100\n"))
    after = parse_samples(
        'tieredkv_cache_hit_tokens_total{tier="device"} 50\n'
        'tieredkv_cache_hit_tokens_total{tier="disk"} 30\n'
        "tieredkv_prompt_tokens_total 400\n"
    )
    reused = replay.reused_tokens(before, after, replay.OURS_COUNTERS)
    assert reused == {"hit_tokens": 70, "server_prompt_tokens": 300}
    peer = parse_samples(
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 256\n'
    )
    reused = replay.reused_tokens({}, peer, replay.VLLM_COUNTERS)
    assert reused == {"hit_tokens": 64, "server_prompt_tokens": 256}


def test_client_command_replays_the_trace_at_the_given_speed() -> None:
    spec = replay.ReplaySpec(Path("t.jsonl"), 0.5, "model", Path("/m"), 20)
    command = replay.client_command("http://h:1", spec, Path("/out"), "r.json")
    flags = dict(itertools.pairwise(command))
    assert flags["--dataset-name"] == "timed_trace"
    assert flags["--timed-trace-sec-multiplier"] == "0.5"
    assert flags["--timed-trace-chunk-hash-size"] == "16"
    assert flags["--num-prompts"] == "20" and flags["--result-filename"] == "r.json"
    assert "ttft:2000" in command


def test_loads_are_shares_of_the_near_saturation_compression() -> None:
    args = trace_replay.parse_args(["--compression", "30", "--loads", "half,near,overload"])
    assert args.loads == {"half": 15.0, "near": 30.0, "overload": 36.0}
    meta = {"span_s": 300.0, "uncached_prompt_tokens": 6000, "output_tokens": 900}
    loads = trace_replay.load_settings(args.loads, meta)
    assert loads["near"]["replay_s"] == 10.0 and loads["half"]["replay_s"] == 20.0
    assert loads["near"]["uncached_prompt_tokens_per_s"] == 600.0
    assert loads["half"]["output_tokens_per_s"] == 45.0


def run_record(server: str, ttft_p50_s: float, hit_tokens: int) -> dict:
    return {
        "kind": "run",
        "server": server,
        "load": "near",
        "repeat": 0,
        "ttft_p50_s": ttft_p50_s,
        "ttft_p90_s": 2 * ttft_p50_s,
        "hit_tokens": hit_tokens,
        "trace_max_hit_tokens": 1000,
        "failed": 0,
        "cold_prefill_s": 2.048,
    }


def handmade_result() -> dict:
    meta = json.loads(scaling.SCALED_META.read_text())
    return {
        "benchmark": "trace_replay",
        "date": "2026-01-01T00:00:00Z",
        "dir": "trace_replay/x",
        "command": ["benchmarks/trace_replay.py"],
        "machine": {"cpu_model": "cpu", "cpu_flags": [], "cores": 2, "mem_total_gib": 8},
        "peers": {"vllm": {"vllm": "0.32.0", "torch": "2.13.0"}},
        "settings": {
            "trace": meta,
            "loads": {
                "near": {
                    "time_compression": 24.0,
                    "replay_s": 145.0,
                    "uncached_prompt_tokens_per_s": 625.5,
                    "output_tokens_per_s": 48.0,
                }
            },
            "goodput_slo_ms": replay.GOODPUT_SLO_MS,
            "cold_probe_tokens": 2048,
            "hash_seed": "0",
            "repeats": 2,
            "tieredkv": {"args": ["--device-cache-size", "1GiB"]},
            "vllm": {"kv_gib": 1},
        },
        "summary": {},
        "records": [
            run_record("tieredkv", 0.4, 990),
            run_record("tieredkv", 0.6, 1000),
            run_record("vllm", 1.0, 400),
            run_record("vllm", 1.0, 420),
            {"kind": "request", "server": "vllm", "load": "near", "ttft_s": 1.0},
        ],
    }


def test_report_shows_medians_ratios_and_targets() -> None:
    text = render_markdown([handmade_result()])
    lines = text.splitlines()
    ttft = next(line for line in lines if line.startswith("| TTFT p50"))
    assert "500 (400-600)" in ttft and "1000 (1000-1000)" in ttft
    assert "0.500×" in ttft and "≤ 0.8× (met)" in ttft
    reuse = next(line for line in lines if line.startswith("| reused prompt tokens"))
    assert "99.5 (99.0-100.0)" in reuse and "(met)" in reuse
    assert "**near saturation**: trace time compressed 24× (626 uncached prompt and 48" in text
    assert "over 145 s, 63% of vLLM's cold prefill rate in these runs)" in text
    assert "trace_replay/x" in text
    assert render_markdown([]).endswith("No results yet.\n")


def test_a_written_result_renders_in_the_benchmarks_page(tmp_path: Path) -> None:
    result = handmade_result()
    write_result(
        tmp_path / "trace_replay" / "x",
        trace_replay.BENCHMARK,
        settings=result["settings"],
        summary={},
        records=result["records"],
        peers=result["peers"],
    )
    page = bench_report.render(tmp_path)
    assert "## Mooncake conversation trace against vLLM" in page
    assert "`benchmarks/results/trace_replay/x`" in page

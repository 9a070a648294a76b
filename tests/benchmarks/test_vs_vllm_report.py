"""benchmarks/vs_vllm.py's report on result files the test writes: only the latest sitting is
combined, each figure is the median of the runs' medians with their (min-max) (one run: its
samples' range), targets are judged on those medians, and the same files render the same bytes
(the real runs start vLLM and the default model, too slow for the suite)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.vs_vllm import BENCHMARK, first_server, render_markdown
from tieredkv.bench.result_file import load_results, write_result


def spread(median: float, low: float | None = None, high: float | None = None) -> dict:
    return {"median": median, "min": low or median, "max": high or median, "n": 3}


def server(prefill: float, warm_ms: float, ms_per_token: float, cached: list[int]) -> dict:
    return {
        "prefill_tok_per_s": {"2048": spread(prefill, prefill - 100, prefill + 100)},
        "warm_ttft_s": {"1024": {**spread(warm_ms / 1000), "cached_tokens": cached}},
        "decode": {
            "1": {
                "context_tokens": 2700,
                "ms_per_token": spread(ms_per_token),
                "tokens_per_s": spread(1000 / ms_per_token),
            }
        },
        "memory": {"peak_rss_bytes": 3 * 2**30, "hwm_sum_bytes": 4 * 2**30, "processes": 1},
    }


def turn(disk_ms: float, bound_ms: float, matches: bool = True) -> dict:
    return {
        "disk_ttft_s": disk_ms / 1000,
        "bound_s": bound_ms / 1000,
        "met": disk_ms <= bound_ms,
        "server_count_matches": matches,
    }


def overflow(ours_ms: float, peer_ms: float, peer_ws_ms: float) -> dict:
    def entry(p50_ms: float, **extra: object) -> dict:
        return {
            "ttft_p50_s": p50_ms / 1000,
            "ttft_p90_s": 2 * p50_ms / 1000,
            "hit_ratio": 0.9,
            "peak_rss_bytes": 2**30,
            "hwm_sum_bytes": 2**30,
            **extra,
        }

    return {
        "tieredkv": entry(ours_ms, kv_ram="768MiB + 256MiB", disk="8GiB"),
        "vllm": entry(peer_ms, kv_gib=1),
        "vllm_working_set": entry(peer_ws_ms, kv_gib=4),
    }


def write(root: Path, name: str, sitting: str, first: str, summary: dict) -> None:
    settings = {
        "sitting": sitting,
        "first": first,
        "repeats": 3,
        "kv_gib": 2,
        "tieredkv": {
            "device_cache_size": "2GiB",
            "host_cache_size": "0",
            "workspace_arena_bytes": 3 * 2**30,
            "max_num_seqs": 16,
            "max_model_len": 8192,
        },
        "overflow": {"working_set_bytes": int(3.5 * 2**30)},
    }
    peers = {
        "vllm": {
            "vllm": "0.32.0",
            "torch": "2.13.0+cpu",
            "settings": {"VLLM_CPU_KVCACHE_SPACE": "2"},
        }
    }
    path = write_result(
        root / name,
        BENCHMARK,
        settings=settings,
        summary=summary,
        records=[],
        peers=peers,
        argv=["vs_vllm.py"],
    )
    result = json.loads(path.read_text())
    result["date"] = f"2026-01-0{name[-1]}T00:00:00Z"  # runs in name order, whatever the clock
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def sitting_of_three(root: Path) -> None:
    write(
        root,
        "run1",
        "old",
        "vllm",
        {"tieredkv": server(99999, 1, 1, [0]), "vllm": server(1, 1, 1, [0])},
    )
    runs = [  # (ours prefill, vLLM prefill, ours warm ms, vLLM warm ms, disk turns, overflow)
        (
            5000,
            4000,
            90,
            100,
            [turn(180, 200), turn(190, 185, matches=False)],
            overflow(150, 4300, 140),
        ),
        (5200, 4400, 95, 100, [turn(170, 175)], overflow(160, 4500, 150)),
        (4800, 4200, 120, 100, [], overflow(900, 4400, 160)),
    ]
    for index, (ours, peer, ours_ms, peer_ms, turns, over) in enumerate(runs, start=2):
        summary = {
            "tieredkv": server(ours, ours_ms, 10.0, [1024, 1024]),
            "vllm": server(peer, peer_ms, 12.0, [1024, 1008, 1024]),
            "agreement": [
                {
                    "prompt_tokens": 64,
                    "generated_tokens": 64,
                    "first_divergence": 32 + index,
                    "agreement": (32 + index) / 64,
                }
            ],
            "fp32_parity": {"equal": True, "prompt_tokens": 36, "generated_tokens": 32},
            "overflow": over,
        }
        if turns:
            summary["tiers"] = {"disk_read": {"bytes_per_s": index * 1e9}, "turns": turns}
        write(root, f"run{index}", "sitting-b", "vllm" if index % 2 else "tieredkv", summary)


def test_the_latest_sitting_combines_the_runs_medians(tmp_path: Path) -> None:
    sitting_of_three(tmp_path)
    page = render_markdown(load_results(tmp_path)[BENCHMARK])
    assert page.startswith("## ")
    assert "99,999" not in page and "`run1`" not in page  # the older sitting is left out
    assert "Sitting `sitting-b`" in page and "`run2`, `run3`, `run4`" in page
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| ")}
    prefill = rows["| cold prefill, 2048 tokens"]
    assert "| 5,000 (4,800-5,200) tok/s | 4,200 (4,000-4,400) tok/s | 1.19x |" in prefill
    assert prefill.endswith("| yes | - / - |")
    warm = rows["| warm turn TTFT, 1024-token history"]
    assert "| 95 (90-120) ms | 100 ms | 0.95x | <= 1.0x vLLM | yes |" in warm
    disk = next(line for line in page.splitlines() if "history on disk" in line)
    assert (
        "(2 of 3 turns within)" in disk
        and "| NO |" in disk
        and "disk 2.50 (2.00-3.00) GB/s" in disk
    )
    over = next(line for line in page.splitlines() if "chats 3.5x a 1 GiB KV budget" in line)
    assert (
        "| 160 (150-900) ms | 4,400 (4,300-4,500) ms | 27.5x lower |" in over and "| yes |" in over
    )
    assert "agreed with the client's in 2 of 3 turns" in page
    assert "| 1024 tokens | 1,024 | 1,024 (1,008-1,024) |" in page  # cached tokens, both servers
    assert "| 64 | 55 (53-56) % | 3 |" in page  # 34, 35 and 36 of 64 tokens agree
    assert "equal in 3 of 3 run(s)" in page
    assert "| vLLM, KV for the working set | 4 GiB | 150 (140-160) ms |" in page
    assert "Working set: 3.50 GiB" in page
    assert "vllm-cpu 0.32.0, torch 2.13.0+cpu (VLLM_CPU_KVCACHE_SPACE=2)" in page
    assert "run by run: tieredkv, vllm, tieredkv" in page
    assert "p99" not in page


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    sitting_of_three(tmp_path)
    results = load_results(tmp_path)[BENCHMARK]
    assert render_markdown(results) == render_markdown(list(reversed(results)))
    assert render_markdown(results) == render_markdown(load_results(tmp_path)[BENCHMARK])


def test_one_run_shows_its_samples_range_and_a_miss_says_no(tmp_path: Path) -> None:
    write(
        tmp_path,
        "run1",
        "solo",
        "vllm",
        {"tieredkv": server(3000, 150, 14.0, [1024]), "vllm": server(4000, 100, 12.0, [1024])},
    )
    page = render_markdown(load_results(tmp_path)[BENCHMARK])
    prefill = next(line for line in page.splitlines() if "cold prefill" in line)
    assert "| 3,000 (2,900-3,100) tok/s | 4,000 (3,900-4,100) tok/s | 0.75x |" in prefill
    assert prefill.endswith("| NO | - / - |")
    assert "median of its samples" in page


def test_the_first_server_alternates_within_a_sitting(tmp_path: Path) -> None:
    args = argparse.Namespace(first=None, sitting="s")
    assert first_server(args, tmp_path) == "vllm"
    write(tmp_path, "run1", "s", "vllm", {})
    assert first_server(args, tmp_path) == "tieredkv"
    assert first_server(argparse.Namespace(first=None, sitting="other"), tmp_path) == "vllm"
    assert first_server(argparse.Namespace(first="tieredkv", sitting="s"), tmp_path) == "tieredkv"


def test_a_sitting_without_the_long_parts_shows_them_from_the_newest_that_ran_them(
    tmp_path: Path,
) -> None:
    sitting_of_three(tmp_path)  # runs 2-4 of sitting-b ran the disk rule and the overflow part
    quick = {"tieredkv": server(6000, 80, 9.0, [1024]), "vllm": server(4000, 100, 12.0, [1024])}
    write(tmp_path, "run5", "sitting-c", "vllm", quick)
    page = render_markdown(load_results(tmp_path)[BENCHMARK])
    assert "Sitting `sitting-c`" in page and "`run5`" in page
    prefill = next(line for line in page.splitlines() if "cold prefill" in line)
    assert "| 6,000 (5,900-6,100) tok/s | 4,000 (3,900-4,100) tok/s |" in prefill
    decode = next(line for line in page.splitlines() if "decode x1, ms/token" in line)
    assert "| 0.75x | <= 0.8x vLLM | yes |" in decode  # 9 ms against 12 ms
    disk = next(line for line in page.splitlines() if "history on disk" in line)
    assert "(2 of 3 turns within)" in disk  # sitting-b's turns
    assert "| vLLM, KV for the working set | 4 GiB | 150 (140-160) ms |" in page
    assert "The disk-rule rows: sitting `sitting-b`" in page
    assert "The overflow rows: sitting `sitting-b`" in page
    assert "`run2`, `run3`, `run4`), the newest that ran them" in page
    # the sitting that ran everything names no earlier one
    full = render_markdown([r for r in load_results(tmp_path)[BENCHMARK] if r["dir"] != "run5"])
    assert "the newest that ran them" not in full

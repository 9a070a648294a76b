"""benchmarks/miss_cost.py: the two servers' flags, the summary of alternating repeats against
the 3% limit, and the docs section rendered from a written result file."""

import argparse
from pathlib import Path

from benchmarks.miss_cost import CONFIGS, render_markdown, server_args, summarize
from tieredkv.bench.result_file import load_results, write_result


def record(config: str, repeat: int, scale: float) -> dict:
    tiers = config == "tiers"
    return {
        "config": config,
        "repeat": repeat,
        "request_throughput": 1.0 / scale,
        "output_throughput": 32.0 / scale,
        "p50_ttft_ms": 500.0 * scale,
        "p90_ttft_ms": 900.0 * scale,
        "p50_tpot_ms": 60.0 * scale,
        "server_cpu_s_per_request": 1.5 * scale,
        "prompt_tokens": 48 * 1024,
        "hit_tokens": 0.0,
        "bytes_to_host": 2**30 if tiers else 0.0,
        "bytes_to_disk": 2**30 if tiers else 0.0,
        "others_cores": 0.5 * repeat,
    }


def test_only_the_tiers_side_has_host_disk_and_write_through(tmp_path: Path) -> None:
    args = argparse.Namespace(
        max_model_len=2048, device_cache_size="1GiB", host_cache_size="512MiB",
        disk_cache_size="1GiB",
    )  # fmt: skip
    baseline = server_args("no_cache", args, tmp_path)
    tiers = server_args("tiers", args, tmp_path)
    assert "--no-cache" in baseline and "--disk-cache-dir" not in baseline
    assert baseline[baseline.index("--host-cache-size") + 1] == "0"
    assert tiers[tiers.index("--write-policy") + 1] == "write_through"
    assert tiers[tiers.index("--disk-cache-dir") + 1] == str(tmp_path)
    assert baseline[:4] == tiers[:4]  # the same model length and device size


def test_summary_judges_the_medians_and_the_section_renders(tmp_path: Path) -> None:
    # the tiers side 2% slower at the median repeat, 10% in an outlier: within the limit
    scales = {"no_cache": (1.0, 1.0, 1.01), "tiers": (1.02, 1.10, 1.0)}
    records = [
        record(config, repeat, scales[config][repeat]) for repeat in range(3) for config in CONFIGS
    ]
    summary = summarize(records)
    assert summary["sides"]["tiers"]["p50_ttft_ms"] == {"median": 510.0, "min": 500.0,
                                                        "max": 550.0}  # fmt: skip
    assert round(summary["ratios"]["p50_ttft_ms"], 6) == 1.02
    assert all(summary["within_limit"].values())
    assert summary["checks"] == {
        "every_replay_wrote_host": True, "every_replay_wrote_disk": True, "reused_tokens": 0
    }  # fmt: skip
    baseline = [r for r in records if r["config"] == "no_cache"]
    slower = [r | {"p50_ttft_ms": r["p50_ttft_ms"] * 1.05} for r in records if r not in baseline]
    verdict = summarize(baseline + slower)
    assert verdict["within_limit"]["p50_ttft_ms"] is False
    assert verdict["within_limit"]["request_throughput"] is True

    settings = {"num_prompts": 48, "input_len": 1024, "output_len": 32, "rate": 0.8,
                "repeats": 3}  # fmt: skip
    root = tmp_path / "results"
    write_result(root / "miss_cost" / "run-1", "miss_cost", settings=settings, summary=summary,
                 records=records)  # fmt: skip
    page = render_markdown(load_results(root)["miss_cost"])
    assert page.startswith("## The cost of a miss")
    assert "`miss_cost/run-1`" in page
    assert "| p50_ttft_ms | 500 (500-505) | 510 (500-550) | 1.020x | yes |" in page
    assert "wrote a median 1,024 MiB to host and 1,024 MiB to disk" in page
    assert "reused 0 of 147,456 prompt tokens" in page
    assert "Other processes used 0.5 (0-1) cores meanwhile" in page

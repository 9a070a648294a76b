"""The benchmark's outputs: `report.json` (every figure and every request), a Markdown summary
(`summary.md`, also printed), and the PNG plots, all in one output directory.

Report shape (version 2): {"version", "command", "workload", "arrival", "machine", "disk",
"runs": [run...], "baseline_label", "tables", "check_equal", "targets" (first run),
"targets_by_run", "vs_peer", "replicas" (`--replicas`: replica_report.analyze), "work_dir",
"plots"}; each run:
{"label", "base_url", "model", "metrics_available", "summary": {"overall", "reuse_rounds",
"by_round"}, "promotion", "transfer_bytes", "evicted_pages", "records", ...} (a replicas run
adds "replicas": its count, remote tier, router policy and restarts). None is unknown (JSON
null)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path

from tieredkv.bench import plots, tables
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.equality import describe
from tieredkv.bench.records import fmt_times
from tieredkv.bench.replica_report import replicas_tables
from tieredkv.bench.targets import targets_table
from tieredkv.bench.workload import WorkloadConfig

REPORT_VERSION = 2  # 2: without "hf_prefill" and "policy_grid" (benchmarks/ scripts now)


def new_report(argv: list[str], workload: WorkloadConfig, arrival: ArrivalConfig) -> dict:
    return {
        "version": REPORT_VERSION,
        "command": ["tieredkv", "bench", "multiturn", *argv],
        "workload": dataclasses.asdict(workload),
        "arrival": {
            "mode": "round_robin" if arrival.rate_per_s is None else "poisson",
            **dataclasses.asdict(arrival),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "disk": None,
        "runs": [],
        "baseline_label": None,
        "tables": {},
        "check_equal": None,
        "targets": None,
        "targets_by_run": None,
        "vs_peer": None,
        "replicas": None,
        "work_dir": None,
        "plots": [],
    }


def baseline_of(report: dict) -> dict | None:
    label = report["baseline_label"]
    return next((r for r in report["runs"] if r["label"] == label), None)


def finish(report: dict, out_dir: Path, make_plots: bool = True) -> str:
    """Fill in tables and plots, write report.json and summary.md; the summary text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = baseline_of(report)
    runs = report["runs"]
    report["tables"]["runs"] = tables.runs_table(runs, baseline)
    report["tables"]["rounds"] = {run["label"]: tables.rounds_table(run) for run in runs}
    sweep = [r for r in runs if r.get("sweep")]
    if sweep:
        report["tables"]["sweep"] = tables.sweep_table(sweep, baseline)
    if report.get("replicas"):
        replica_runs = [r for r in runs if "replicas" in r]
        report["tables"]["replicas"] = replicas_tables(replica_runs, report["replicas"])
    if make_plots and runs:
        report["plots"] = [
            str(plots.ttft_by_round(runs, out_dir / "ttft_by_round.png")),
            str(plots.hit_ratio_by_tier(runs, out_dir / "hit_ratio_by_tier.png")),
            str(plots.promotion_distribution(runs[0], out_dir / "promotion_latency.png")),
        ]
        if len(sweep) > 1:
            report["plots"].append(str(plots.capacity_sweep(sweep, out_dir / "sweep.png")))
    text = summary_text(report)
    (out_dir / "summary.md").write_text(text)
    with open(out_dir / "report.json", "w") as f:
        json.dump(report, f, indent=1)
    return text


def summary_text(report: dict) -> str:
    parts = [f"# tieredkv bench multiturn\n\n`{' '.join(report['command'])}`\n"]
    if report["disk"]:
        disk = report["disk"]
        parts.append(
            f"disk read bandwidth (same run): {disk['bytes_per_s'] / 1e9:.2f} GB/s "
            f"(probe O_DIRECT {'on' if disk['o_direct'] else 'off'})\n"
        )
    parts.append("## Runs (reuse rounds; promotion latency: bucket-resolution estimates)\n")
    parts.append(report["tables"]["runs"] + "\n")
    if "sweep" in report["tables"]:
        parts.append("## Capacity sweep\n\n" + report["tables"]["sweep"] + "\n")
    if "replicas" in report["tables"]:
        parts.append("## Replicas behind SGLang's router (reuse rounds)\n\n"
                     + report["tables"]["replicas"] + "\n")  # fmt: skip
    if report.get("vs_peer"):
        parts.append(
            "TTFT p50 speed-up against the peer (peer p50 / ours): "
            + ", ".join(f"{label}: {fmt_times(x)}" for label, x in report["vs_peer"].items())
            + "\n"
        )
    if report["check_equal"]:
        parts.append("\n".join(describe(report["check_equal"])) + "\n")
    if report["targets"]:
        parts.append("## Targets (first run)\n\n" + targets_table(report["targets"]) + "\n")
    for label, table in report["tables"]["rounds"].items():
        parts.append(f"## Per round: {label}\n\n{table}\n")
    return "\n".join(parts)

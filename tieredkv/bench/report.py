"""The benchmark's outputs: `report.json` (every figure and every request) and a Markdown
summary (`summary.md`, also printed), in one output directory (benchmarks/plots.py draws it).

Report shape (version 3): {"version", "command", "workload", "arrival", "machine", "disk",
"runs": [run...], "baseline_label", "tables", "sections", "targets" (first run),
"targets_by_run", "work_dir"}; each run:
{"label", "base_url", "model", "metrics_available", "summary": {"overall", "reuse_rounds",
"by_round"}, "promotion", "transfer_bytes", "records", ...}. "sections" holds
{title: Markdown} that a script adds (benchmarks/replicas.py, capacity_sweep.py). None is
unknown (JSON null)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tieredkv.bench import tables
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.result_file import machine_info, machine_line
from tieredkv.bench.targets import targets_table
from tieredkv.bench.workload import WorkloadConfig

REPORT_VERSION = 3


def new_report(argv: list[str], workload: WorkloadConfig, arrival: ArrivalConfig) -> dict:
    return {
        "version": REPORT_VERSION,
        "command": argv,
        "workload": dataclasses.asdict(workload),
        "arrival": {
            "mode": "round_robin" if arrival.rate_per_s is None else "poisson",
            **dataclasses.asdict(arrival),
        },
        "machine": machine_info(),
        "disk": None,
        "runs": [],
        "baseline_label": None,
        "tables": {},
        "sections": {},
        "targets": None,
        "targets_by_run": None,
        "work_dir": None,
    }


def baseline_of(report: dict) -> dict | None:
    label = report["baseline_label"]
    return next((r for r in report["runs"] if r["label"] == label), None)


def finish(report: dict, out_dir: Path) -> str:
    """Fill in the tables, write report.json and summary.md; the summary text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = baseline_of(report)
    runs = report["runs"]
    report["tables"]["runs"] = tables.runs_table(runs, baseline)
    report["tables"]["rounds"] = {run["label"]: tables.rounds_table(run) for run in runs}
    text = summary_text(report)
    (out_dir / "summary.md").write_text(text)
    with open(out_dir / "report.json", "w") as f:
        json.dump(report, f, indent=1)
    return text


def summary_text(report: dict) -> str:
    parts = [f"# tieredkv bench multiturn\n\n`{' '.join(report['command'])}`\n"]
    parts.append(f"Machine: {machine_line(report)}\n")
    if report["disk"]:
        disk = report["disk"]
        parts.append(
            f"disk read limit (same run, best shape {disk['chunk_bytes'] >> 20} MiB x "
            f"{disk['in_flight']} in flight): {disk['bytes_per_s'] / 1e9:.2f} GB/s "
            f"(probe O_DIRECT {'on' if disk['o_direct'] else 'off'})\n"
        )
    parts.append("## Runs (reuse rounds; server promo: server-reported, bucket estimates)\n")
    parts.append(report["tables"]["runs"] + "\n")
    for title, text in report["sections"].items():
        parts.append(f"## {title}\n\n{text}\n")
    if report["targets"]:
        parts.append("## Targets (first run)\n\n" + targets_table(report["targets"]) + "\n")
    for label, table in report["tables"]["rounds"].items():
        parts.append(f"## Per round: {label}\n\n{table}\n")
    return "\n".join(parts)

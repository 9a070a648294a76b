"""A benchmark's raw result as a committed file: what ran, where, when, and every sample.

Each run writes one `result.json` in a folder of its own
(`benchmarks/results/<benchmark>/<UTC date-time>/`). `benchmark` names the module under
`benchmarks/` whose `render_markdown(results)` turns such files into a section of
`docs/benchmarks.md`, so every figure in the docs can be traced to a file and regenerated.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULT_NAME = "result.json"
# The CPU features that decide which kernels run (bf16 natively, AMX tiles, AVX-512)
RELEVANT_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _proc_field(path: str, name: str) -> str:
    """The value of `name: value` in a /proc text file ("" when absent or unreadable)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ""
    return next(
        (v.strip() for k, _, v in (line.partition(":") for line in lines) if k.strip() == name), ""
    )


def machine_info() -> dict:
    """The CPU (model and the flags that pick kernels), cores, RAM and kernel of this machine."""
    flags = set(_proc_field("/proc/cpuinfo", "flags").split())
    mem_kib = _proc_field("/proc/meminfo", "MemTotal").split()
    return {
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "cpu_flags": [flag for flag in RELEVANT_CPU_FLAGS if flag in flags],
        "cores": os.cpu_count(),
        "mem_total_gib": round(int(mem_kib[0]) / 2**20, 1) if mem_kib else 0.0,
        "kernel": platform.release(),
    }


def machine_line(result: dict) -> str:
    """One line naming the machine a result was measured on, for a table's caption."""
    machine = result["machine"]
    flags = ", ".join(machine["cpu_flags"]) or "none of " + ", ".join(RELEVANT_CPU_FLAGS)
    return (
        f"{machine['cpu_model']} ({flags}), {machine['cores']} cores, "
        f"{machine['mem_total_gib']:g} GiB RAM"
    )


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def write_result(
    out_dir: Path,
    benchmark: str,
    *,
    settings: dict,
    summary: dict,
    records: list[dict],
    peers: dict | None = None,
    argv: list[str] | None = None,
) -> Path:
    """Write `out_dir/result.json` (created with its parents) and return its path."""
    result = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": list(sys.argv if argv is None else argv),
        "git_commit": _git_commit(),
        "machine": machine_info(),
        "settings": settings,
        "peers": peers or {},
        "summary": summary,
        "records": records,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_NAME
    path.write_text(_dumps(result))
    return path


def _dumps(result: dict) -> str:
    """Indented JSON, except that each record takes one line: a run's thousands of samples
    stay a small file that still diffs record by record."""
    placeholder = '"records": "__records__"'
    head = json.dumps({**result, "records": "__records__"}, indent=1, sort_keys=True)
    lines = ",\n  ".join(
        json.dumps(record, sort_keys=True, separators=(",", ":")) for record in result["records"]
    )
    body = f'"records": [\n  {lines}\n ]' if lines else '"records": []'
    return head.replace(placeholder, body) + "\n"


def load_results(root: Path) -> dict[str, list[dict]]:
    """Every `result.json` below `root`, grouped by benchmark, each group in order of date.

    Each result gets `dir`: its folder relative to `root`, so a table can name its source."""
    grouped: dict[str, list[dict]] = {}
    for path in sorted(root.rglob(RESULT_NAME)):
        result = json.loads(path.read_text())
        result["dir"] = path.parent.relative_to(root).as_posix()
        grouped.setdefault(result["benchmark"], []).append(result)
    for results in grouped.values():
        results.sort(key=lambda result: (result["date"], result["dir"]))
    return dict(sorted(grouped.items()))

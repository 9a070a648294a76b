"""The memory probe: the weights it judges by come from the model file; its section renders."""

from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.memory_probe import render_markdown, weights_bytes

GIB = 1 << 30


def test_weights_are_the_files_tensor_elements_at_the_served_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    save_file({"a": torch.zeros(3, 4, dtype=torch.float32)}, tmp_path / "one.safetensors")
    save_file({"b": torch.zeros(5, dtype=torch.bfloat16)}, tmp_path / "two.safetensors")
    assert weights_bytes(str(tmp_path), "bfloat16") == (12 + 5) * 2
    assert weights_bytes(str(tmp_path), "float32") == (12 + 5) * 4


def test_the_section_shows_peak_against_the_limit_and_the_workspace() -> None:
    summary = {
        "weights_bytes": GIB // 4,
        "tiers_bytes": 2 * GIB,
        "limit_bytes": int(2.5 * GIB),
        "idle_rss_bytes": 2 * GIB,
        "peak_rss_bytes": 3 * GIB,
        "workspace_budget_bytes": GIB // 2,
        "workspace_peak_resident_bytes": GIB // 4,
        "met": False,
    }
    settings = {
        "requests": 16,
        "prompt_tokens": 5000,
        "device_cache_size": "1GiB",
        "host_cache_size": "1GiB",
    }
    machine = {"cpu_model": "CPU", "cpu_flags": [], "cores": 2, "mem_total_gib": 8}
    result = {"summary": summary, "settings": settings, "machine": machine, "dir": "probe/1"}
    row = next(line for line in render_markdown([result]).splitlines() if "probe/1" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:] == [
        "16 x 5000",
        "1GiB + 1GiB",
        "0.25",
        "2.50",
        "2.00",
        "3.00",
        "1.20",
        "0.50 / 0.25",
        "no",
    ]


def test_the_breakdown_table_shows_each_kind_idle_and_at_peak() -> None:
    kinds = {"heap": GIB, "shared_anonymous": GIB // 2, "anonymous": GIB // 4}
    kinds |= {"libraries": GIB // 8, "files": 0}
    summary = {
        "weights_bytes": GIB // 4,
        "limit_bytes": int(2.5 * GIB),
        "idle_rss_bytes": GIB,
        "peak_rss_bytes": 2 * GIB,
        "workspace_budget_bytes": 0,
        "workspace_peak_resident_bytes": 0,
        "idle_breakdown_bytes": {kind: size // 2 for kind, size in kinds.items()},
        "breakdown_bytes": kinds,
        "met": True,
    }
    settings = {"requests": 1, "prompt_tokens": 5, "device_cache_size": "1", "host_cache_size": "1"}
    machine = {"cpu_model": "CPU", "cpu_flags": [], "cores": 2, "mem_total_gib": 8}
    result = {"summary": summary, "settings": settings, "machine": machine, "dir": "probe/2"}
    rows = [line for line in render_markdown([result]).splitlines() if "probe/2" in line]
    cells = [cell.strip() for cell in rows[1].strip("|").split("|")]
    assert cells[1:] == ["0.50 / 1.00", "0.25 / 0.50", "0.12 / 0.25", "0.06 / 0.12", "0.00 / 0.00"]

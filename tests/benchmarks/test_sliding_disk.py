"""benchmarks/sliding_disk.py on small workloads: layer records hold more tokens of long chats
than whole-page records in the same file bytes and their next turns reuse more from disk,
short chats (within one window) every sliding layer; every run leaves the cache consistent, the
store without errors; the result renders."""

import argparse
from pathlib import Path

from benchmarks.sliding_disk import HEAD_DIM, render_markdown, replay
from benchmarks.sliding_history import Workload, gemma3_1b_shape
from tieredkv.bench.result_file import load_results, write_result

LONG = Workload("long", 6, 6, 256, 128)  # 2,304 tokens a chat, four and a half windows
SHORT = Workload("short", 40, 4, 64, 32)  # 384 tokens a chat, within one window
MODEL = gemma3_1b_shape(head_dim=HEAD_DIM)


def args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(
        device_pages=192, host_pages=32, disk_pages=512, disk_root=tmp_path, seed=0
    )


def test_long_chats_keep_more_history_in_layer_records(tmp_path: Path) -> None:
    whole = replay(MODEL, False, LONG, args(tmp_path))
    split = replay(MODEL, True, LONG, args(tmp_path))
    for record in (whole, split):
        assert record["integrity_ok"] and record["disk_errors"] == 0
    assert abs(split["disk_file_bytes"] - whole["disk_file_bytes"]) < 64 << 10  # the same file
    assert whole["disk_sliding_tokens"] == whole["disk_full_tokens"]
    assert split["disk_full_tokens"] > whole["disk_full_tokens"]
    assert split["disk_sliding_tokens"] < split["disk_full_tokens"]
    assert whole["reusable_tokens"] == split["reusable_tokens"] > 0
    assert split["reused_from_disk_tokens"] > whole["reused_from_disk_tokens"]
    assert whole["reused_tokens"] < split["reused_tokens"] <= split["reusable_tokens"]
    write_result(
        tmp_path / "sliding_disk" / "x", "sliding_disk",
        settings={**vars(args(tmp_path)), "disk_root": "", "page_size": 16, "prefill_chunk": 512},
        summary={"full_layers": 4, "sliding_layers": 22, "window": 512,
                 "disk_whole_tokens": 8192},
        records=[whole, split],
    )  # fmt: skip
    (result,) = load_results(tmp_path)["sliding_disk"]
    assert "| 6 (long) | 2,304 | 13,824 | layer |" in render_markdown([result])


def test_short_chats_keep_every_sliding_layer(tmp_path: Path) -> None:
    """Within one window every page keeps its sliding layers, the ancestors a disk copy
    writes first included: layer records hold what whole ones do, less their headers."""
    whole = replay(MODEL, False, SHORT, args(tmp_path))
    split = replay(MODEL, True, SHORT, args(tmp_path))
    assert whole["integrity_ok"] and split["integrity_ok"]
    assert split["disk_sliding_tokens"] == split["disk_full_tokens"]
    assert (
        0.95 * whole["disk_full_tokens"] <= split["disk_full_tokens"] <= whole["disk_full_tokens"]
    )
    assert split["reused_from_disk_tokens"] > 0 and whole["reused_from_disk_tokens"] > 0

"""benchmarks/sliding_device.py on small workloads: the split device pool holds more tokens of
long chats than whole pages in the same bytes and their next turns reuse more, short chats
(within one window) exactly as much; every run leaves the cache consistent; the result
renders."""

import argparse
from pathlib import Path

from benchmarks.sliding_device import render_markdown, replay
from benchmarks.sliding_history import Workload, gemma3_1b_shape
from tieredkv.bench.result_file import load_results, write_result

ARGS = argparse.Namespace(device_pages=320, seed=0)
LONG = Workload("long", 4, 8, 256, 128)  # 3,072 tokens a chat, six windows
SHORT = Workload("short", 24, 4, 64, 32)  # 384 tokens a chat, within one window


def test_long_chats_keep_more_history_split_than_whole(tmp_path: Path) -> None:
    model = gemma3_1b_shape()
    whole = replay(model, False, LONG, ARGS)
    split = replay(model, True, LONG, ARGS)
    assert whole["integrity_ok"] and split["integrity_ok"]
    assert whole["device_capacity_bytes"] == split["device_capacity_bytes"]  # the same bytes
    assert split["device_full_tokens"] > whole["device_full_tokens"]
    assert split["device_sliding_tokens"] < split["device_full_tokens"]
    assert whole["reusable_tokens"] == split["reusable_tokens"] > 0
    assert split["reused_tokens"] > whole["reused_tokens"]
    assert split["reused_tokens"] <= split["reusable_tokens"]
    # a running chat holds its whole sequence in whole pages, split only its window's parts
    assert whole["running_peak_pages"] == whole["longest_sequence_pages"] == 192
    assert split["running_peak_pages"] < whole["running_peak_pages"] / 2
    write_result(
        tmp_path / "sliding_device" / "x", "sliding_device",
        settings={**vars(ARGS), "page_size": 16, "prefill_chunk": 512},
        summary={"full_layers": 4, "sliding_layers": 22, "window": 512,
                 "device_whole_tokens": 5120},
        records=[whole, split],
    )  # fmt: skip
    (result,) = load_results(tmp_path)["sliding_device"]
    assert "| 4 (long) | 3,072 | 12,288 | split |" in render_markdown([result])


def test_short_chats_keep_every_layer_and_reuse_as_much_as_whole_pages() -> None:
    model = gemma3_1b_shape()
    whole = replay(model, False, SHORT, ARGS)
    split = replay(model, True, SHORT, ARGS)
    assert split["integrity_ok"]
    assert split["device_full_tokens"] == split["device_sliding_tokens"]  # within the window
    assert split["reused_tokens"] == whole["reused_tokens"] > 0

"""benchmarks/radix_ops.py on tiny sizes: the report's shape and sane values (never timings)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.radix.radix import main
from benchmarks.radix.radix_driver import ChatDriver
from benchmarks.radix.radix_phases import chat_calls, eviction_cost, tiny_cache
from benchmarks.radix.radix_workload import ChatShape, ChatWorkload
from tieredkv.cache.index.token_run import PackedTokens

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "radix_ops.py"


def check_summary(summary: dict) -> None:
    assert summary["count"] > 0
    for name in ("p50_us", "mean_us"):
        assert math.isfinite(summary[name]) and summary[name] > 0, name
    if summary["count"] < 100:  # too few calls for a p99
        assert summary["p99_us"] is None
    else:
        assert summary["p50_us"] <= summary["p99_us"]


def test_the_script_runs_from_any_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "radix_ops.py" in done.stdout


def test_main_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "radix.json"
    assert main(["--quick", "--profile", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    machine = report["machine"]
    for when in ("before", "after"):
        assert 0 < machine[f"cpu_share_{when}"]["share"] <= 1
    assert machine["compare_floor_3k_tokens_us"] > 0
    assert machine["packed_floor_3k_tokens_us"] > 0
    assert "radix_index.py" in report["profile"]["match"]
    assert "radix_index.py" in report["profile"]["insert"]
    chat = report["chat"]
    assert chat["integrity_ok"] and report["eviction"]["integrity_ok"]
    for name in ("pack", "match", "insert", "lock", "unlock"):
        check_summary(chat[name])
    assert chat["match"]["count"] == 2 * chat["turns"]  # on arrival and at admission
    assert chat["pack"]["count"] == chat["turns"]  # once per request
    # SGLang is not run here, so no SGLang figure appears anywhere
    assert not [key for key in report if "sglang" in key.lower()]
    sglang_lines = [line for line in printed.splitlines() if "SGLang" in line]
    assert len(sglang_lines) == 1 and "not measured" in sglang_lines[0]
    assert not any(ch.isdigit() for ch in sglang_lines[0])
    assert chat["insert"]["count"] >= 100 and chat["insert"]["p99_us"] is not None
    check_summary(report["eviction"]["evict_1"])
    check_summary(report["eviction"]["evict_batch"])
    points = report["match_scaling"]
    assert [p["target_nodes"] for p in points] == [20, 60]
    for point in points:
        assert point["tree_nodes"] >= point["target_nodes"]
        check_summary(point["match"])


def test_workload_prompts_follow_the_shape() -> None:
    shape = ChatShape()
    turns = list(ChatWorkload(seed=3, active_users=3).turns(max_users=6))
    assert {t.user for t in turns} == set(range(6))
    system = turns[0].prompt[: shape.system_len]
    history: dict[int, list[int]] = {}
    for turn in turns:
        assert 2500 <= len(turn.prompt) <= shape.max_prompt
        assert turn.prompt[: shape.system_len] == system  # one shared system prompt
        previous = history.get(turn.user)
        if previous is not None:  # a later turn extends everything said so far
            assert turn.prompt[: len(previous)] == previous
        history[turn.user] = turn.prompt + turn.output


def test_driver_reuses_the_previous_turn() -> None:
    workload = ChatWorkload(seed=4, active_users=1)
    cache = tiny_cache(2000)
    driver = ChatDriver(cache)
    turns = workload.turns(max_users=1)
    first, second = next(turns), next(turns)
    driver.run(first)
    used = cache.device_pool.num_used
    assert used == (len(first.prompt) + len(first.output) - 1) // 16  # the tree's pages only
    match = cache.match(second.prompt)
    assert match.matched_len == used * 16  # the whole first turn is reused
    driver.run(second)
    assert not cache.index.lock_holders and cache.check_integrity().ok


def test_the_tree_holds_the_turn_packed() -> None:
    turn = next(ChatWorkload(seed=6, active_users=1).turns(max_users=1))
    cache = tiny_cache(400)
    ChatDriver(cache).run(turn)
    nodes = list(cache.tree.iter_nodes())  # one path: a node per insert that added pages
    assert all(len(node.children) <= 1 for node in nodes)
    kept = (len(turn.prompt) + len(turn.output) - 1) // 16 * 16
    stored = b"".join(node.packed for node in nodes)  # parents first: the path in order
    assert stored == PackedTokens.from_ids((turn.prompt + turn.output)[:kept]).data
    assert cache.match(turn.prompt).matched_len == (len(turn.prompt) - 1) // 16 * 16


def test_eviction_frees_pages_from_a_full_device() -> None:
    report, cache = chat_calls(users=3, active=2, seed=5)
    nodes = cache.tree.num_nodes
    pages = cache.device_pool.num_used
    result = eviction_cost(cache, count=10, batch_pages=4)
    assert result["integrity_ok"] and report["integrity_ok"]
    assert cache.device_pool.num_used == pages - 10 - 4  # the timed evictions' pages left
    assert result["evict_1_us_per_page"] > 0 and nodes > 0

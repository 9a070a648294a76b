"""benchmarks/check_equal.py: greedy outputs of a report's cached run against its baseline."""

import json
from pathlib import Path

from benchmarks.check_equal import compare_runs, describe, first_difference, main


def records(answers: dict[tuple[int, int], str]) -> list[dict]:
    return [{"user": user, "round_index": round_index, "error": None, "text": text}
            for (user, round_index), text in answers.items()]  # fmt: skip


ANSWERS = {(0, 0): "Answer one", (1, 0): "Answer two", (0, 1): "Answer three", (1, 1): "Four"}


def test_fp32_lists_every_difference_and_bf16_gives_shares() -> None:
    changed = {key: text.replace("Answer", "Answr") for key, text in ANSWERS.items()}
    result = compare_runs(records(changed), records(ANSWERS), "float32")
    assert (result["compared"], result["diverged"]) == (4, 3)
    assert result["differences"][0]["char_index"] == 4  # "Answ|r" vs "Answ|e"
    assert {(d["user"], d["round"]) for d in result["differences"]} == {(0, 0), (1, 0), (0, 1)}
    lines = describe(result)
    assert "3/4 outputs differ" in lines[0] and len(lines) == 4
    bf16 = compare_runs(records(changed), records(ANSWERS), "bfloat16")
    assert bf16["share_diverged"] == 0.75 and bf16["first_divergence"]["round_p50"] == 0
    assert first_difference("abc", "abc") is None and first_difference("abc", "ab") == 2


def write_report(directory: Path, cached: dict, dtype: str = "float32") -> None:
    runs = [{"label": "tieredkv", "server_args": ["--dtype", dtype], "records": records(cached)},
            {"label": "recompute", "records": records(ANSWERS)}]  # fmt: skip
    report = {"runs": runs, "baseline_label": "recompute"}
    (directory / "report.json").write_text(json.dumps(report))


def test_main_judges_the_reports_runs_at_their_dtype(tmp_path: Path) -> None:
    write_report(tmp_path, ANSWERS)
    assert main([str(tmp_path)]) == 0
    assert json.loads((tmp_path / "check_equal.json").read_text())["identical"] is True
    one_off = ANSWERS | {(1, 1): "Five"}
    write_report(tmp_path, one_off)
    assert main([str(tmp_path)]) == 1  # fp32: any difference fails
    write_report(tmp_path, one_off, "bfloat16")
    assert main([str(tmp_path)]) == 0  # bf16: the share is reported
    assert json.loads((tmp_path / "check_equal.json").read_text())["share_diverged"] == 0.25

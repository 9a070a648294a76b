"""benchmarks/forks.py: one `--quick` run against a real server; the prompt tokens it
computed show the fork computing the prompt once and the separate namespaces n times."""

import json
from pathlib import Path

from benchmarks import forks


def test_quick_run_reports_every_way_and_the_prompt_computed_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert forks.main(["--quick", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    runs = {run["way"]: run for run in report["runs"]}
    assert set(runs) == {"fork", "shared", "apart"}
    n, prompt_tokens = report["settings"]["n"], report["settings"]["prompt_tokens"]
    assert runs["fork"]["prefill_tokens"] == prompt_tokens
    assert runs["apart"]["prefill_tokens"] == n * prompt_tokens
    # shared: the first computes the prompt, the others their partial last page at most
    assert prompt_tokens <= runs["shared"]["prefill_tokens"] < n * prompt_tokens
    for run in runs.values():
        assert run["completion_tokens"] == n * report["settings"]["max_tokens"]
        assert 0 < run["first_token_s"] <= run["last_first_token_s"] <= run["makespan_s"]
    assert "| fork |" in (out / "summary.md").read_text()

"""benchmarks/replicas.py (`--replicas 2`) end to end on tiny sizes (the default model, fp32): one
configuration (the remote tier on a real Redis, SGLang's real router round-robin over two real
replicas, so the conversation's turns alternate replicas: the round-1 turn lands on replica 1,
which never saw the conversation, once replica 0's writes to Redis have settled, so its history
must come from Redis), replica 0 stopped before the round-2 turn, which then lands on replica 1
while replica 0 starts again. Asserts what happened, never how fast."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import replicas
from tests.redis_servers import require_redis
from tests.router_process import require_router

TINY = ["--replicas", "2", "--remote", "on", "--router-policies", "round_robin",
        "--users", "1", "--rounds", "3", "--system-words", "40", "--document-words", "60",
        "--max-tokens", "8", "--dtype", "float32", "--max-model-len", "512",
        "--device-cache-size", "24MiB", "--host-cache-size", "0", "--disk-cache-size", "256MiB",
        "--no-baseline"]  # fmt: skip


def test_replicas_run_through_the_restart(tmp_path: Path) -> None:
    require_redis()
    require_router()
    out = tmp_path / "out"
    argv = [*TINY, "--out", str(out), "--work-dir", str(tmp_path / "work")]
    assert replicas.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    assert run["label"] == "remote + round_robin"
    assert [c["label"] for c in report["replicas"]["configurations"]] == [run["label"]]

    (restart,) = run["replicas"]["restarts"]  # replica 0 went away and came back
    assert (restart["round"], restart["before_user"], restart["replica"]) == (2, 0, 0)
    assert Path(restart["log"]).exists()
    overall = run["summary"]["overall"]
    assert overall["requests"] == 3 and overall["errors"] == 0
    assert restart["start_s"] > 0 and restart["seconds"] >= restart["start_s"]
    # the round-2 turn (the run's last) went elsewhere while replica 0 was away: the restarted
    # replica served no chat at all (uvicorn logs every request it answers)
    restarted_log = Path(restart["log"]).read_text()
    assert "GET /health" in restarted_log and "POST /v1/chat/completions" not in restarted_log
    after = next(r for r in run["records"] if r["round_index"] == 2)
    # ... and found its history there or in Redis
    assert after["cached_tokens"] > after["prompt_tokens"] / 2, after
    assert report["replicas"]["configurations"][0]["lost_after_restart"] == []
    # round 1 on replica 1: its history came from Redis through a promotion, beside Redis's
    # own GET limit
    assert run["remote_writes_settled"] == [True, True, True]
    turn = next(r for r in run["records"] if r["round_index"] == 1)
    assert turn["cached_by_tier"]["remote"] > turn["prompt_tokens"] / 2, turn
    promotion, limit = run["remote_promotion"], run["redis_get"]
    assert promotion["promotions"] >= 1 and promotion["bytes"] > 0 and promotion["gbps"] > 0
    assert limit["values"] > 0 and limit["bytes"] > 0 and limit["gbps"] > 0
    assert limit["batch"] >= 1
    assert "## Replicas behind SGLang's router" in (out / "summary.md").read_text()

"""benchmarks/replicas_router.py end to end on tiny sizes: two real replicas on a real Redis
behind the real router, replica 0 restarted between rounds 1 and 2; no timed assertions."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.replicas_router import CONFIGS, run_config
from tests.redis_servers import require_redis
from tests.router_process import require_router


def test_a_configuration_runs_through_the_restart(tmp_path: Path) -> None:
    require_redis()
    require_router()
    args = argparse.Namespace(users=1, document_words=60, max_model_len=512, device="24MiB",
                              host="0")  # fmt: skip
    run = run_config(args, tmp_path, *CONFIGS[0], "float32")
    assert len(run["restart_s"]) == 1  # replica 0 went away and came back
    overall, reuse = run["summary"]["overall"], run["summary"]["reuse_rounds"]
    assert overall["requests"] == 3 and overall["errors"] == 0
    assert reuse["hit_ratio"] > 0.5  # the conversation's history came back after the restart
    assert run["round2_ttft_p50_s"] is not None

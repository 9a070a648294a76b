"""The multi-turn chat workload through SGLang's router over two tieredkv replicas, with the
remote tier on and off and the router's `cache_aware` and `round_robin` policies, in one run;
replica 0 is restarted between rounds 1 and 2 (its conversations' next turns land on the other
replica while it is away, or on its own warm-restarted disk when it is back).

Per configuration: a fresh Redis (remote on), two fresh replicas (bf16 by default, small
device and host tiers and a disk tier each: the multiturn default preset's sizes) and the
router; `tieredkv.bench.workload_run` drives the workload against the router (round-robin over
users, one request in flight, ~3.3k-token histories). Reported from the client's records:
TTFT of the reuse rounds (1 and 2) and of round 2 alone (after the restart), hit ratio per
tier, failed requests. With `--fp32-check`, the remote + cache_aware configuration runs once
more in fp32 beside one single fp32 server, and the greedy outputs are compared.

    .venv/bin/python -m benchmarks.replicas_router [--users 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.integration.server_process import ServerProcess
from tests.redis_servers import RedisServer, require_redis
from tests.router_process import RouterProcess, require_router
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.equality import compare_runs
from tieredkv.bench.records import fmt
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.bench.workload_run import run_workload

CONFIGS = (  # (label, remote tier, router policy)
    ("remote + cache_aware", True, "cache_aware"),
    ("remote + round_robin", True, "round_robin"),
    ("local + cache_aware", False, "cache_aware"),
    ("local + round_robin", False, "round_robin"),
)
RESTART_BEFORE_ROUND = 2


def replica_args(args: argparse.Namespace, dtype: str, disk: Path, redis_url: str | None) -> list:
    out = ["--dtype", dtype, "--max-model-len", str(args.max_model_len),
           "--device-cache-size", args.device,
           "--host-cache-size", args.host, "--disk-cache-dir", str(disk),
           "--disk-cache-size", "4GiB"]  # fmt: skip
    return out + (["--remote-cache-url", redis_url] if redis_url else [])


def workload_of(args: argparse.Namespace) -> Workload:
    return Workload(WorkloadConfig(num_users=args.users, num_rounds=3, system_words=150,
                                   document_words=args.document_words, max_tokens=32))  # fmt: skip


def run_config(
    args: argparse.Namespace, work: Path, label: str, remote: bool, policy: str, dtype: str
) -> dict:
    tag = label.replace(" + ", "-") + "-" + dtype
    redis = RedisServer(work / f"redis-{tag}").start() if remote else None
    url = redis.url if redis else None
    specs = [replica_args(args, dtype, work / f"disk-{tag}-{i}", url) for i in range(2)]
    replicas = [ServerProcess(spec, work / f"{tag}-{i}.log") for i, spec in enumerate(specs)]
    router = RouterProcess([r.base_url for r in replicas], work / f"router-{tag}.log", policy)
    restarts: list[float] = []

    def before_round(round_index: int) -> None:
        if round_index != RESTART_BEFORE_ROUND:
            return
        started = time.perf_counter()
        old = replicas[0]
        old.stop()
        replicas[0] = ServerProcess(specs[0], work / f"{tag}-0-restarted.log", port=old.port)
        router.wait_for({r.base_url for r in replicas})
        restarts.append(time.perf_counter() - started)

    try:
        router.wait_for({r.base_url for r in replicas})
        workload = workload_of(args)
        result = run_workload(router.base_url, workload, ArrivalConfig(1), before_round, tag)
    finally:
        router.stop()
        for replica in replicas:
            replica.stop()
        if redis is not None:
            redis.stop()
    records = result["records"]
    round2 = [r for r in records if r["round_index"] == RESTART_BEFORE_ROUND and not r["error"]]
    ttfts2 = sorted(r["ttft_s"] for r in round2 if r["ttft_s"] is not None)
    return {
        "label": label,
        "dtype": dtype,
        "summary": result["summary"],
        "round2_ttft_p50_s": ttfts2[len(ttfts2) // 2] if ttfts2 else None,
        "restart_s": restarts,
        "records": records,
    }


def single_server_run(args: argparse.Namespace, work: Path) -> dict:
    server = ServerProcess(replica_args(args, "float32", work / "disk-single", None),
                           work / "single.log")  # fmt: skip
    try:
        workload = workload_of(args)
        return run_workload(server.base_url, workload, ArrivalConfig(1), None, "single-fp32")
    finally:
        server.stop()


def table(runs: list[dict]) -> str:
    lines = ["| configuration | reuse TTFT p50 ms | p90 | round 2 (after restart) p50 | hit "
             "| device | host | disk | remote | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in runs:
        reuse = run["summary"]["reuse_rounds"]
        by_tier = reuse["hit_ratio_by_tier"]
        tiers = " | ".join(fmt(by_tier.get(t), ".0%") for t in ("device", "host", "disk", "remote"))
        lines.append(
            f"| {run['label']} ({run['dtype']}) | {fmt(reuse['ttft_s']['p50'], '.0f', 1000)} "
            f"| {fmt(reuse['ttft_s']['p90'], '.0f', 1000)} "
            f"| {fmt(run['round2_ttft_p50_s'], '.0f', 1000)} | {fmt(reuse['hit_ratio'], '.0%')} "
            f"| {tiers} | {run['summary']['overall']['errors']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # odd: round_robin then sends a conversation's turns to alternate replicas (with an even
    # number of users, turn k of user u lands on replica (u + k * users) % 2 = u % 2: sticky)
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--document-words", type=int, default=2400)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--device", default="192MiB")
    parser.add_argument("--host", default="64MiB")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--configs", default=",".join(str(i) for i in range(len(CONFIGS))),
                        help="indices into CONFIGS to run")  # fmt: skip
    parser.add_argument("--fp32-check", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    require_redis()
    require_router()
    runs = []
    report: dict = {"settings": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="tkv-router-") as tmp:
        work = Path(tmp)
        for index in (int(i) for i in args.configs.split(",")):
            label, remote, policy = CONFIGS[index]
            runs.append(run_config(args, work, label, remote, policy, args.dtype))
            print(table(runs[-1:]), flush=True)
        if args.fp32_check:
            routed = run_config(args, work, *CONFIGS[0], "float32")
            single = single_server_run(args, work)
            report["fp32_check"] = compare_runs(routed["records"], single["records"], "float32")
            runs.append(routed)
    report["runs"] = runs
    print(table(runs))
    if "fp32_check" in report:
        check = report["fp32_check"]
        print(f"fp32 outputs identical to one server's: {check['identical']} "
              f"({check['compared']} compared)")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Two replicas sharing the remote tier on a loopback Redis: what a turn costs on a replica that
never saw the conversation, beside recomputing it and beside a local disk hit, in one run.

Replica A has a small device tier, no host tier and a disk tier, so the histories it computed
leave its device for its disk; replica B has room. Both use `--remote-cache-url` on one Redis.
For each of `--conversations` histories of ~`--history-tokens` token ids (/v1/completions,
`max_tokens` 1, so TTFT is the request's latency):

  1. A computes the history (cold everywhere): its pages go to A's disk and to Redis (the
     run waits until A has written them all, and reports how long that took after the last
     history: `remote_written_s`).
  2. B gets history + a new question: the history comes from Redis      -> "remote hit"
  3. A gets history + another question: the history comes from its disk  -> "local disk hit"
     (A's store dropped from the page cache first)
  4. B gets history + the first question under a fresh `cache_salt`: recomputed -> "recompute"

Each request's tiers come from its usage (a row whose history did not come from the tier it is
meant to measure is reported and left out). Limits in the same run: Redis's own pipelined GET
throughput on the values the replicas wrote (one client, batches like the transfer jobs'), beside
the remote tier's promotion bandwidth (B's `transfer_bytes_total{from_tier="remote"}` over its
`promotion_seconds_sum{from_tier="remote"}`). Targets: remote hit TTFT <= recompute / 10 and
<= 2 x the local disk hit's (medians). Run from the repository root (it starts Redis with the
test suite's helper):

    .venv/bin/python -m benchmarks.remote_replicas [--conversations 4] [--history-tokens 3200]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import httpx
import torch

from benchmarks.redis_server import RedisServer, require_redis_server
from benchmarks.remote_limit import redis_get_throughput, scrape
from tieredkv.bench.disk_check import drop_page_cache
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.prom_text import counter_delta, select
from tieredkv.bench.records import spread
from tieredkv.cache.page_layout import PageLayout
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.hf_config import parse_model_config, read_config_json

QUESTION_TOKENS = 64
WARM_UP_TOKENS = 256
VOCAB = range(1000, 40000)


def completion(server: ManagedServer, tokens: list[int], salt: str | None = None) -> dict:
    body: dict = {"prompt": tokens, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    started = time.perf_counter()
    reply = httpx.post(server.base_url + "/v1/completions", json=body, timeout=600)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    details = reply.json()["usage"]["prompt_tokens_details"]
    return {"ttft_s": seconds, "by_tier": details["cached_tokens_by_tier"]}


def remote_bytes_written(server: ManagedServer) -> float:
    samples = scrape(server.base_url)
    return sum(select(samples, "tieredkv_transfer_bytes_total", to_tier="remote").values())


def page_bytes(dtype: str) -> int:
    model_dir = default_model_dir()
    config = parse_model_config(read_config_json(model_dir), model_dir)
    return PageLayout.for_model(config, 16, getattr(torch, dtype)).page_bytes


def wait_until_written(server: ManagedServer, num_bytes: int, timeout_s: float = 30.0) -> float:
    """Seconds until `server` has written `num_bytes` to Redis in all (its writes are
    asynchronous: a fixed sleep was too short on a loaded machine), at most `timeout_s`."""
    started = time.monotonic()
    while remote_bytes_written(server) < num_bytes and time.monotonic() - started < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - started


def run(args: argparse.Namespace, work: Path) -> dict:
    require_redis_server()
    rng = random.Random(args.seed)
    histories = [[rng.choice(VOCAB) for _ in range(args.history_tokens)]
                 for _ in range(args.conversations)]  # fmt: skip
    questions = [[rng.choice(VOCAB) for _ in range(QUESTION_TOKENS)] for _ in range(3 * 8)]
    server = RedisServer(work / "redis", extra_args=("--maxmemory", "4gb",
                         "--maxmemory-policy", "allkeys-lru")).start()  # fmt: skip
    common = ["--dtype", args.dtype, "--max-model-len", str(args.history_tokens + 128),
              *server.serve_flags(),
              "--remote-budget-scale", str(args.remote_budget_scale)]  # fmt: skip
    disk_dir = work / "disk-a"
    a_args = [*common, "--device-cache-size", args.small_device, "--host-cache-size", "0",
              "--disk-cache-dir", str(disk_dir), "--disk-cache-size", "4GiB"]  # fmt: skip
    b_args = [*common, "--device-cache-size", "1GiB", "--host-cache-size", "0"]
    rows: dict[str, list[dict]] = {"remote": [], "disk": [], "recompute": []}
    try:
        with ManagedServer(a_args, work / "a.log") as a, ManagedServer(b_args, work / "b.log") as b:
            for server_ in (a, b):  # warm-up: one unrelated prompt each
                completion(server_, [rng.choice(VOCAB) for _ in range(WARM_UP_TOKENS)])
            for history in histories:
                completion(a, history)
            # every full page A computed (warm-up and histories) in Redis: then B can see them
            pages = WARM_UP_TOKENS // 16 + sum(len(h) // 16 for h in histories)
            written_s = wait_until_written(a, pages * page_bytes(args.dtype))
            before = scrape(b.base_url)
            for index, history in enumerate(histories):
                rows["remote"].append(completion(b, history + questions[3 * index]))
            after = scrape(b.base_url)
            drop_page_cache(disk_dir)
            for index, history in enumerate(histories):
                rows["disk"].append(completion(a, history + questions[3 * index + 1]))
            for index, history in enumerate(histories):
                salt = f"recompute-{index}"
                rows["recompute"].append(completion(b, history + questions[3 * index], salt))
            limit = redis_get_throughput(server.url, batch=args.get_batch)
    finally:
        server.stop()
    pages = args.history_tokens // 16
    meant = {"remote": "remote", "disk": "disk", "recompute": None}
    kept = {}
    for name, tier in meant.items():
        ok = [r for r in rows[name]
              if (tier is None and sum(r["by_tier"].values()) == 0)
              or (tier is not None and r["by_tier"][tier] >= (pages - 1) * 16)]  # fmt: skip
        kept[name] = spread([r["ttft_s"] for r in ok])
    moved = counter_delta(before, after, "tieredkv_transfer_bytes_total", from_tier="remote")
    promo_s = counter_delta(before, after, "tieredkv_promotion_seconds_sum", from_tier="remote")
    promotion_gbps = moved / promo_s / 1e9 if moved and promo_s else None
    remote, disk, recompute = (kept[n]["median"] for n in ("remote", "disk", "recompute"))
    targets = {
        "remote <= recompute / 10": None if None in (remote, recompute)
        else remote <= recompute / 10,
        "remote <= 2 x disk": None if None in (remote, disk) else remote <= 2 * disk,
    }  # fmt: skip
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    return {"settings": settings | {"work": str(work)}, "rows": rows, "ttft_s": kept,
            "redis_get": limit, "promotion_gbps": promotion_gbps, "targets": targets,
            "remote_written_s": written_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--history-tokens", type=int, default=3200)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--small-device", default="96MiB", help="replica A's device tier")
    parser.add_argument("--get-batch", type=int, default=88, help="GETs per round trip")
    parser.add_argument("--remote-budget-scale", type=float, default=1.0,
                        help="the replicas' flag (tests on a loaded machine: 20)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tkv-remote-") as tmp:
        report = run(args, Path(tmp))
    for name, figures in report["ttft_s"].items():
        print(f"{name:>10} TTFT: {json.dumps(figures)}")
    print(f"Redis pipelined GET: {json.dumps(report['redis_get'])}")
    print(f"remote promotion bandwidth: {report['promotion_gbps']}")
    print(f"A's pages all in Redis {report['remote_written_s']:.2f} s after its last history")
    print(f"targets: {json.dumps(report['targets'])}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m benchmarks.router_compare`: routers over tieredkv replicas on a multi-tenant
workload with long shared prefixes, the remote tier on and off.

    .venv/bin/python -m benchmarks.router_compare [--replicas 3] [--remote on,off]
        [--routers dynamo,cache_aware,round_robin] [--tenants 16] [--requests 120]
        [--rate 0.5] [--reps 1] [--quick] [--out DIR]

The routers:
- `dynamo`: NVIDIA Dynamo's KV-aware router (benchmarks/dynamo_router.sh installs it), fed by
  the replicas' KV events (`--kv-events-endpoint`): it knows which pages each replica holds,
  on which tier, and what it evicted. The client asks it for a replica with the prompt's token
  ids and sends the request there.
- `cache_aware`, `round_robin`: SGLang's router (`sglang-router`) with that policy, the client
  sending through it; `cache_aware` guesses from the text it has forwarded.

Each configuration (remote on/off x router) starts from nothing: a fresh Redis (remote on), N
fresh replicas with the same flags (KV events published in every configuration, so each pays
the same) and the router. Each replica serves one short prompt and is flushed before the
workload (benchmarks/router_workload.py) runs. The reps rotate the routers' order. Per
configuration: TTFT p50/p90 over every request of every rep, and the prompt tokens reused, by
tier, from the replicas' `tieredkv_cache_hit_tokens_total` (the increase over the workload).
`--quick`: tiny sizes for tests (figures meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.dynamo_process import DynamoRouter, dynamo_version, require_dynamo
from benchmarks.presets import parse_with_preset
from benchmarks.redis_server import RedisServer, require_redis_server
from benchmarks.router import RouterProcess, require_router
from benchmarks.router_client import Sender, drive
from benchmarks.router_report import render_markdown, summarize, table
from benchmarks.router_workload import TenantRequest, TenantWorkloadConfig, build_requests
from tieredkv.bench.client import scrape_metrics, served_model
from tieredkv.bench.managed import ManagedServer, free_port
from tieredkv.bench.prom_text import counter_delta, parse_samples
from tieredkv.bench.records import TIERS
from tieredkv.bench.result_file import write_result
from tieredkv.errors import ConfigError
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer

__all__ = ["main", "render_markdown"]  # bench_report renders results through this module

REPO = Path(__file__).resolve().parent.parent
ROUTERS = ("dynamo", "cache_aware", "round_robin")
REMOTE_WORDS = {"on": True, "off": False}
PRESETS = {
    "default": dict(
        replicas=3,
        threads=1,  # three replicas share the machine's cores
        tenants=16,
        system_words=400,
        requests=120,
        rate=0.5,
        max_tokens=8,
        reps=1,
        max_model_len=1024,
        device_cache="96MiB",
        host_cache="192MiB",
    ),
    "quick": dict(
        replicas=2,
        threads=1,
        tenants=3,
        system_words=60,
        requests=6,
        rate=4.0,
        max_tokens=2,
        reps=1,
        max_model_len=256,
        device_cache="16MiB",
        host_cache="24MiB",
    ),
}
WARMUP_PROMPT = "Say hello."


def replica_args(args: argparse.Namespace, kv_port: int, remote_flags: list[str]) -> list[str]:
    """One replica's `tieredkv serve` flags: small tiers, KV events on `kv_port`, and
    `remote_flags` (a remote tier's, or none)."""
    flags = [
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--page-size",
        str(args.page_size),
        "--device-cache-size",
        args.device_cache,
        "--host-cache-size",
        args.host_cache,
        "--kv-events-endpoint",
        f"tcp://*:{kv_port}",  # a wildcard host binds (as in vLLM); the router connects
    ]
    return flags + remote_flags


async def measure(
    servers: list[ManagedServer],
    entry: str | DynamoRouter,
    args: argparse.Namespace,
    requests: list[TenantRequest],
    rep: int,
    tokenizer: ChatTokenizer,
) -> tuple[list[dict], dict]:
    """Warm each replica, flush it, run the workload; the records and the reused tokens."""
    urls = [server.base_url for server in servers]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
        model = await served_model(http, urls[0])
        for url in urls:
            warm = {"model": model, "prompt": WARMUP_PROMPT, "max_tokens": 2}
            (await http.post(url + "/v1/completions", json=warm)).raise_for_status()
            (await http.post(url + "/v1/cache/flush")).raise_for_status()
        before = [parse_samples(await scrape_metrics(http, url) or "") for url in urls]
        sender = Sender(http, model, args.max_tokens, urls, entry, tokenizer)
        rows = await drive(sender, requests, rep)
        after = [parse_samples(await scrape_metrics(http, url) or "") for url in urls]
    reused = {
        tier: sum(
            counter_delta(b, a, "tieredkv_cache_hit_tokens_total", tier=tier) or 0
            for b, a in zip(before, after, strict=True)
        )
        for tier in TIERS
    }
    prompt = sum(
        counter_delta(b, a, "tieredkv_prompt_tokens_total") or 0
        for b, a in zip(before, after, strict=True)
    )
    return rows, {"reused_by_tier": reused, "prompt_tokens": prompt}


def run_config(
    remote: bool,
    router: str,
    rep: int,
    args: argparse.Namespace,
    requests: list[TenantRequest],
    tokenizer: ChatTokenizer,
) -> dict:
    """One configuration from nothing; its result record."""
    tag = f"rep{rep}-{'remote' if remote else 'local'}-{router}"
    log_dir = args.work_dir / tag
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as running:
        remote_flags = []
        if remote:
            remote_flags = running.enter_context(RedisServer(log_dir / "redis")).serve_flags()
        kv_ports = [free_port() for _ in range(args.replicas)]
        servers = []
        for index, port in enumerate(kv_ports):
            server = ManagedServer(
                replica_args(args, port, remote_flags),
                log_dir / f"replica{index}.log",
                args.threads,
            )
            servers.append(running.enter_context(server))
        for server in servers:
            server.wait_ready()
        urls = [server.base_url for server in servers]
        if router == "dynamo":
            endpoints = [f"tcp://127.0.0.1:{port}" for port in kv_ports]
            entry = running.enter_context(DynamoRouter(endpoints, args.page_size, log_dir))
        else:
            sglang = RouterProcess(urls, log_dir / "router.log", router)
            running.callback(sglang.stop)
            sglang.wait_for(set(urls))
            entry = sglang.base_url
        rows, counters = asyncio.run(measure(servers, entry, args, requests, rep, tokenizer))
    return {"remote": remote, "router": router, "rep": rep, **counters, "requests": rows}


def peer_versions(routers: list[str]) -> dict:
    peers = {}
    if "dynamo" in routers:
        peers["ai-dynamo-runtime"] = dynamo_version()
    if any(router != "dynamo" for router in routers):
        peers["sglang-router"] = importlib.metadata.version("sglang-router")
    return peers


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--replicas", type=int)
    add("--remote", default="on,off", help="comma-separated: on, off")
    add("--routers", default=",".join(ROUTERS), help=f"comma-separated of {ROUTERS}")
    for name in ("tenants", "system_words", "requests", "max_tokens", "reps", "max_model_len"):
        add("--" + name.replace("_", "-"), type=int)
    add("--rate", type=float, help="requests per second (Poisson arrivals)")
    add("--seed", type=int, default=0)
    add("--page-size", type=int, default=16)
    add("--dtype", default="float32")
    add("--device-cache-size", dest="device_cache")
    add("--host-cache-size", dest="host_cache")
    add("--threads", type=int, help="OMP_NUM_THREADS of each replica")
    add("--work-dir", type=Path, help="logs (default: a temp dir)")
    add("--out", type=Path, help="result folder (default: benchmarks/results/router_compare/..)")
    add("--quick", action="store_true", help="tiny sizes for tests; figures meaningless")
    args = parse_with_preset(parser, argv, PRESETS)
    args.remote_list = [REMOTE_WORDS[w] for w in args.remote.split(",") if w in REMOTE_WORDS]
    args.router_list = [w for w in args.routers.split(",") if w]
    unknown = [w for w in args.router_list if w not in ROUTERS]
    if unknown or not args.router_list or not args.remote_list:
        raise ConfigError(
            f"--routers takes {ROUTERS} and --remote on/off; got {args.routers!r}, {args.remote!r}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if "dynamo" in args.router_list:
        require_dynamo()
    if any(r != "dynamo" for r in args.router_list):
        require_router()
    if True in args.remote_list:
        require_redis_server()
    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="router-compare-"))
    workload = TenantWorkloadConfig(
        args.tenants, args.system_words, args.requests, args.rate, args.seed
    )
    requests = build_requests(workload)
    tokenizer = ChatTokenizer(default_model_dir())
    records = []
    for rep in range(args.reps):
        shift = rep % len(args.router_list)
        routers = args.router_list[shift:] + args.router_list[:shift]
        for remote in args.remote_list:
            for router in routers:
                records.append(run_config(remote, router, rep, args, requests, tokenizer))
                print(
                    json.dumps({k: v for k, v in records[-1].items() if k != "requests"}),
                    flush=True,
                )
    summary = summarize(records)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "benchmarks" / "results" / "router_compare" / stamp
    skip = ("work_dir", "out", "remote_list", "router_list")
    settings = {k: v for k, v in vars(args).items() if k not in skip}
    peers = peer_versions(args.router_list)
    path = write_result(
        out, "router_compare", settings=settings, summary=summary, records=records, peers=peers
    )
    print(table(summary))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

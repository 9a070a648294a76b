"""Mooncake's conversation trace replayed through vLLM's own client against tieredkv and
vLLM's CPU build, one server at a time, with the same 1 GiB of RAM for KV.

The trace (benchmarks/traces/mooncake_conversations.jsonl, made by
`benchmarks.trace_compare.scaling`, which says how) is replayed at three loads, time
compressed NEAR_SATURATION_COMPRESSION times ("near": near saturation), half as much ("half")
and 1.2 times as much ("overload": past saturation); `--compression` moves all three. Each
(server, load, repeat) starts a fresh server, times one cold prompt, replays the trace, and
reads the server's prompt tokens reused from /metrics. tieredkv runs with a 1 GiB device tier
and a disk tier; vLLM with VLLM_CPU_KVCACHE_SPACE=1 (benchmarks/vllm_cpu.sh). bf16 both. The
server measured first alternates repeat by repeat.

    .venv/bin/python -m benchmarks.trace_replay            # the full sitting (~35 minutes)
    .venv/bin/python -m benchmarks.trace_replay --limit 20 --repeats 1 --out /tmp/x  # smoke
    .venv/bin/python -m benchmarks.trace_replay --render   # the section of docs/benchmarks.md

Near saturation is set by the peer, not by tieredkv: the load asks for about 85% of the prompt
tokens per second that vLLM prefills cold on the machine (the report shows the share against
vLLM's cold prefill measured in the same runs). On another machine pick `--compression` so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from benchmarks.machine_load import OtherLoad, process_ticks, with_descendants
from benchmarks.trace_compare import replay, scaling
from benchmarks.trace_compare.report import render_markdown
from benchmarks.vllm_compare.peers import TreeMemory, VllmServer, process_settings, vllm_versions
from benchmarks.vllm_compare.tiers import page_layout
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.result_file import load_results, write_result
from tieredkv.model.default_model import default_model_dir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
BENCHMARK = "trace_replay"
# trace seconds per replay second for the "near" load: it asks for ~730 uncached prompt tokens/s,
# 85% of vLLM-CPU's cold prefill of a 2k prompt measured within trace replays on a 2-core AMD
# EPYC (~860 tokens/s; at 40x both servers fell behind the trace)
NEAR_SATURATION_COMPRESSION = 35.0
# load name: share of the near-saturation compression
LOADS = {"near": 1.0, "half": 0.5, "overload": 1.2}
MAX_MODEL_LEN = 4096
OURS_RAM = "1GiB"
OURS_DISK = "4GiB"
PEER_KV_GIB = 1

__all__ = ["main", "render_markdown"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    now = datetime.datetime.now(datetime.UTC)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--out", type=Path, default=RESULTS / BENCHMARK / now.strftime("%Y-%m-%dT%H%M"))
    add("--work-dir", type=Path, default=REPO / "bench-results" / "trace", help="logs, stores")
    add("--trace", type=Path, default=scaling.SCALED_TRACE)
    add("--repeats", type=int, default=3)
    add("--first", choices=("vllm", "tieredkv"), default="vllm", help="in the first repeat")
    add("--loads", default=",".join(LOADS), help=f"of {','.join(LOADS)}")
    add("--compression", type=float, default=NEAR_SATURATION_COMPRESSION, help="of the near load")
    add("--limit", type=int, help="replay only the first N requests (smoke runs)")
    add("--skip-vllm", action="store_true")
    add("--tieredkv-args", default="", help="extra `tieredkv serve` flags")
    add("--render", nargs="?", const=RESULTS, type=Path, help="print the report of ROOT's results")
    args = parser.parse_args(argv)
    loads = [load for load in args.loads.split(",") if load]
    if unknown := set(loads) - set(LOADS):
        parser.error(f"unknown loads {sorted(unknown)}; choose from {','.join(LOADS)}")
    # trace seconds per replay second, as shares of the near-saturation load's
    args.loads = {load: args.compression * LOADS[load] for load in loads}
    return args


def ours_args(args: argparse.Namespace, store: Path) -> list[str]:
    flags = ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
    flags += ["--device-cache-size", OURS_RAM, "--host-cache-size", "0"]
    flags += ["--disk-cache-dir", str(store), "--disk-cache-size", OURS_DISK]
    return flags + args.tieredkv_args.split()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its descendants alive now."""
    return sum(process_ticks(p) for p in with_descendants([pid])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, pid: int, spec: replay.ReplaySpec, counters: tuple, out: Path) -> dict:
    """One replay against a fresh server: its cold prefill, the client's figures, reuse, the
    server's CPU time over the replay, and the cores the rest of the machine took meanwhile."""
    with TreeMemory(pid) as memory:
        cold_s = replay.cold_prefill_s(url, spec.model_name)
        before, cpu_s = replay.scrape(url), tree_cpu_s(pid)
        with OtherLoad([pid]) as load:
            raw = replay.run_client(url, spec, out.parent, out.name)
        cpu_s = tree_cpu_s(pid) - cpu_s
        reused = replay.reused_tokens(before, replay.scrape(url), counters)
    run = {"cold_prefill_s": cold_s, **replay.client_summary(raw), **reused}
    run.update(server_cpu_s=cpu_s, others_cores=load.others_cores)
    return {**run, **memory.result(), "requests": replay.client_requests(raw)}


def run_server(args: argparse.Namespace, name: str, spec: replay.ReplaySpec, out: Path) -> dict:
    log = args.work_dir / f"server-{out.stem}.log"
    if name == "vllm":
        with VllmServer(PEER_KV_GIB, MAX_MODEL_LEN, log) as server:
            settings = process_settings(server.process.pid)
            run = measure(server.base_url, server.process.pid, spec, replay.VLLM_COUNTERS, out)
        return {**run, "settings": settings}
    store = args.work_dir / "kv-trace"
    shutil.rmtree(store, ignore_errors=True)
    with ManagedServer(ours_args(args, store), log) as server:
        run = measure(server.base_url, server.process.pid, spec, replay.OURS_COUNTERS, out)
    shutil.rmtree(store, ignore_errors=True)
    return run


def replay_records(args: argparse.Namespace, num_prompts: int, meta: dict) -> list[dict]:
    model_dir = default_model_dir()
    records = []
    for repeat in range(args.repeats):
        first = args.first if repeat % 2 == 0 else ({"vllm", "tieredkv"} - {args.first}).pop()
        order = ["tieredkv"] if args.skip_vllm else [first, *({"vllm", "tieredkv"} - {first})]
        for load, compression in args.loads.items():
            multiplier = 1 / (1000 * compression)  # the trace's ms to replay seconds
            spec = replay.ReplaySpec(args.trace, multiplier, model_dir.name, model_dir, num_prompts)
            for position, name in enumerate(order):
                print(f"repeat {repeat}, {load}, {name}:", flush=True)
                out = args.work_dir / "client" / f"{name}-{load}-{repeat}.json"
                run = run_server(args, name, spec, out)
                requests = run.pop("requests")
                run.update(server=name, load=load, repeat=repeat, run_order=position)
                run["trace_max_hit_tokens"] = meta["trace_max_hit_tokens"]
                print(f"  {json.dumps({k: v for k, v in run.items() if k != 'settings'})}")
                records.append({"kind": "run", **run})
                records += [
                    {"kind": "request", "server": name, "load": load, "repeat": repeat, **r}
                    for r in requests
                ]
    return records


def trace_meta(args: argparse.Namespace, num_prompts: int) -> dict:
    """The scaling of the committed trace, and the trace's own reuse maximum over the
    requests replayed, at tieredkv's page size."""
    meta = json.loads(scaling.SCALED_META.read_text())
    rows = scaling.read_trace(args.trace)[:num_prompts]
    page_size = page_layout().page_size
    hits = scaling.trace_max_hit_tokens(rows, meta["scaling"]["tokens_per_block"], page_size)
    prompt_tokens = sum(row["input_length"] for row in rows)
    meta.update(
        requests=len(rows),
        span_s=rows[-1]["timestamp"] / 1000 if rows else 0.0,
        page_size=page_size,
        prompt_tokens=prompt_tokens,
        output_tokens=sum(row["output_length"] for row in rows),
        trace_max_hit_tokens=sum(hits),
        uncached_prompt_tokens=prompt_tokens - sum(hits),
    )
    return meta


def load_settings(loads: dict[str, float], meta: dict) -> dict:
    """Per load its time compression and the work it asks for per second of replay: prompt
    tokens a perfect cache could not serve, and output tokens."""
    replay_s = {load: meta["span_s"] / compression for load, compression in loads.items()}
    return {
        load: {
            "time_compression": compression,
            "replay_s": replay_s[load],
            "uncached_prompt_tokens_per_s": meta["uncached_prompt_tokens"] / replay_s[load],
            "output_tokens_per_s": meta["output_tokens"] / replay_s[load],
        }
        for load, compression in loads.items()
        if replay_s[load] > 0
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(render_markdown(load_results(args.render).get(BENCHMARK, [])))
        return 0
    # SIGTERM unwinds like an exception, so the servers' context managers stop them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    num_prompts = args.limit or len(scaling.read_trace(args.trace))
    meta = trace_meta(args, num_prompts)
    settings = {
        "trace": meta,
        "loads": load_settings(args.loads, meta),
        "goodput_slo_ms": replay.GOODPUT_SLO_MS,
        "hash_seed": replay.HASH_SEED,
        "repeats": args.repeats,
        "first": args.first,
        "cold_probe_tokens": replay.PROBE_TOKENS,
        "tieredkv": {"args": ours_args(args, Path("STORE")), "kv_ram": OURS_RAM},
        "vllm": {"kv_gib": PEER_KV_GIB, "max_model_len": MAX_MODEL_LEN, "dtype": "bfloat16"},
    }
    peers = {} if args.skip_vllm else {"vllm": vllm_versions()}
    records = replay_records(args, num_prompts, meta)
    path = write_result(
        args.out, BENCHMARK, settings=settings, summary={}, records=records, peers=peers
    )
    print(render_markdown([{**json.loads(path.read_text()), "dir": args.out.name}]))
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

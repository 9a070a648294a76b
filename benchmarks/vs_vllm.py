"""tieredkv against vLLM's CPU build, one server at a time, same client, same prompts.

Measures what a user feels through the HTTP API (token-id prompts on /v1/completions, so both
servers see exactly the same tokens): cold prefill, warm turns (with both servers' cached
tokens), decode (tokens counted from `usage`), the two servers' greedy outputs against each
other and ours against transformers in fp32, and each server's peak memory (see
`benchmarks/vllm_compare`). With `--tiers`, tieredkv alone: a history on disk against the same
history on the device. With `--overflow`, many chats over a 1 GiB KV budget: tieredkv with
1 GiB of RAM and a disk tier, vLLM with the same RAM, and vLLM with KV for the working set.

The server measured first alternates run by run within a sitting (or `--first`). vLLM runs as
its docs recommend for CPUs (benchmarks/vllm_cpu.sh, a pinned version). Each run writes its raw
result (`tieredkv.bench.result_file`) to `--out`; logs and disk stores go to `--work-dir`.

    benchmarks/vllm_cpu.sh install      # once
    .venv/bin/python -m benchmarks.vs_vllm --tiers --overflow
    .venv/bin/python -m benchmarks.vs_vllm --render   # the section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shutil
import signal
import sys
from pathlib import Path

from benchmarks.vllm_compare import agreement, overflow
from benchmarks.vllm_compare.client import Prompts
from benchmarks.vllm_compare.figures import FIGURE_SECTIONS, measure
from benchmarks.vllm_compare.peers import TreeMemory, VllmServer, process_settings, vllm_versions
from benchmarks.vllm_compare.report import render_markdown
from benchmarks.vllm_compare.tiers import MAX_MODEL_LEN, measure_tiers, page_layout
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.result_file import load_results, write_result
from tieredkv.config import EngineConfig
from tieredkv.model.workspace import ROUNDING

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
BENCHMARK = "vs_vllm"
SECTIONS = (*FIGURE_SECTIONS, "agreement", "parity", "tiers", "overflow")
DEFAULT_SECTIONS = (*FIGURE_SECTIONS, "agreement", "parity")

__all__ = ["main", "render_markdown"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    now = datetime.datetime.now(datetime.UTC)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--out", type=Path, default=RESULTS / BENCHMARK / now.strftime("%Y-%m-%dT%H%M"))
    add("--work-dir", type=Path, default=REPO / "bench-results" / "vs-vllm", help="logs, stores")
    add("--sitting", default=now.strftime("%Y-%m-%d"), help="runs combined in the report")
    add("--first", choices=("vllm", "tieredkv"), help="default: alternates within the sitting")
    add("--repeats", type=int, default=3)
    add("--kv-gib", type=int, default=2, help="tieredkv's --device-cache-size, vLLM's KV space")
    add("--seed", type=int, default=0)
    add("--sections", default=",".join(DEFAULT_SECTIONS), help=f"of {','.join(SECTIONS)}")
    add("--tiers", action="store_true", help="add the tiers section")
    add("--overflow", action="store_true", help="add the overflow section")
    add("--overflow-users", type=int, default=overflow.OVERFLOW_USERS, help="chats (smoke runs)")
    add("--skip-vllm", action="store_true")
    add("--tieredkv-args", default="", help="extra `tieredkv serve` flags")
    add("--render", nargs="?", const=RESULTS, type=Path, help="print the report of ROOT's results")
    args = parser.parse_args(argv)
    args.sections = {s for s in args.sections.split(",") if s}
    args.sections |= {name for name in ("tiers", "overflow") if getattr(args, name)}
    if unknown := args.sections - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    return args


def first_server(args: argparse.Namespace, root: Path = RESULTS) -> str:
    """`--first`, else vLLM first in the sitting's even-numbered runs, tieredkv in odd ones
    (counting the sitting's results under `root`)."""
    if args.first:
        return args.first
    earlier = load_results(root).get(BENCHMARK, [])
    runs = sum(r["settings"].get("sitting") == args.sitting for r in earlier)
    return "vllm" if runs % 2 == 0 else "tieredkv"


def ours_settings(args: argparse.Namespace) -> dict:
    """What tieredkv serves with, and its workspace arena (outside the KV budget)."""
    extra = args.tieredkv_args.split()
    seqs = EngineConfig.max_num_seqs
    if "--max-num-seqs" in extra:
        seqs = int(extra[extra.index("--max-num-seqs") + 1])
    capacity = -(-MAX_MODEL_LEN // ROUNDING) * ROUNDING
    return {
        "device_cache_size": f"{args.kv_gib}GiB",
        "host_cache_size": "0",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": seqs,
        "workspace_arena_bytes": seqs * capacity * page_layout().token_bytes,
        "extra_args": extra,
    }


def serve_args(args: argparse.Namespace) -> list[str]:
    ours = ours_settings(args)
    flags = ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
    flags += ["--device-cache-size", ours["device_cache_size"], "--host-cache-size", "0"]
    return flags + ours["extra_args"]


def measure_server(
    args: argparse.Namespace, name: str, url: str, pid: int
) -> tuple[dict, list[dict], list[list[str]] | None]:
    """(summary, records, agreement outputs) of the running server `name`."""
    summary: dict = {}
    records: list[dict] = []
    outputs = None
    with TreeMemory(pid) as memory:
        figure_sections = args.sections & set(FIGURE_SECTIONS)
        if figure_sections:
            prompts = Prompts(args.seed)  # the same prompts for every server
            summary, records = asyncio.run(
                measure(url, prompts, args.repeats, name, pid, figure_sections)
            )
        if "agreement" in args.sections:
            outputs = agreement.agreement_outputs(url, args.seed + 2)
    summary["memory"] = memory.result()
    return summary, records, outputs


def run_figures(args: argparse.Namespace, order: list[str], result: dict) -> None:
    outputs = {}
    for name in order:
        print(f"{name}:", flush=True)
        if name == "vllm":
            log = args.work_dir / "vllm.log"
            with VllmServer(args.kv_gib, MAX_MODEL_LEN, log) as server:
                result["peers"]["vllm"]["settings"] = process_settings(server.process.pid)
                measured = measure_server(args, name, server.base_url, server.process.pid)
        else:
            with ManagedServer(serve_args(args), args.work_dir / "tieredkv.log") as server:
                measured = measure_server(args, name, server.base_url, server.process.pid)
        result["summary"][name], records, outputs[name] = measured
        result["records"] += [{**record, "run_order": order.index(name)} for record in records]
    if outputs.get("tieredkv") and outputs.get("vllm"):
        rows = agreement.agreement(outputs["tieredkv"], outputs["vllm"])
        result["summary"]["agreement"] = rows
        print(f"  token agreement: {[round(row['agreement'], 3) for row in rows]}", flush=True)


def run_overflow(args: argparse.Namespace, order: list[str], result: dict) -> None:
    workload = overflow.overflow_workload(args.seed, args.overflow_users)
    num_bytes, gib = overflow.working_set_gib(workload)
    result["settings"]["overflow"] = {
        "users": args.overflow_users,
        "working_set_bytes": num_bytes,
        "working_set_kv_gib": gib,
    }
    runs = {}
    for name in order:
        print(f"{name}, overflow:", flush=True)
        if name == "tieredkv":
            extra = args.tieredkv_args.split()
            runs["tieredkv"] = overflow.run_ours(args.work_dir, workload, extra)
        else:
            runs["vllm"] = overflow.run_peer(args.work_dir, workload, overflow.PEER_KV_GIB, "vllm")
            runs["vllm_working_set"] = overflow.run_peer(
                args.work_dir, workload, gib, "vllm_working_set"
            )
    shutil.rmtree(args.work_dir / "kv-overflow", ignore_errors=True)
    result["summary"]["overflow"] = {name: summary for name, (summary, _) in runs.items()}
    for name, (_, records) in runs.items():
        position = order.index("tieredkv" if name == "tieredkv" else "vllm")
        result["records"] += [{**record, "run_order": position} for record in records]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(render_markdown(load_results(args.render).get(BENCHMARK, [])))
        return 0
    # SIGTERM unwinds like an exception, so the servers' context managers stop them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    first = first_server(args)
    order = ["tieredkv"] if args.skip_vllm else [first, *({"vllm", "tieredkv"} - {first})]
    settings = {
        "sitting": args.sitting,
        "first": order[0],
        "order": order,
        "seed": args.seed,
        "repeats": args.repeats,
        "kv_gib": args.kv_gib,
        "sections": sorted(args.sections),
        "tieredkv": ours_settings(args),
    }
    peers = {} if args.skip_vllm else {"vllm": {**vllm_versions(), "settings": {}}}
    result: dict = {"settings": settings, "peers": peers, "summary": {}, "records": []}
    if args.sections & {*FIGURE_SECTIONS, "agreement"}:
        run_figures(args, order, result)
    if "parity" in args.sections:
        print("tieredkv, fp32 against transformers:", flush=True)
        result["summary"]["fp32_parity"] = agreement.fp32_parity(args.work_dir)
    if "tiers" in args.sections:
        print("tieredkv, where a hit's time goes:", flush=True)
        prompts = Prompts(args.seed + 1)
        result["summary"]["tiers"] = measure_tiers(args.work_dir, prompts, args.repeats)
    if "overflow" in args.sections:
        run_overflow(args, order, result)
    path = write_result(args.out, BENCHMARK, **result)
    print(render_markdown([{**json.loads(path.read_text()), "dir": args.out.name}]))
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

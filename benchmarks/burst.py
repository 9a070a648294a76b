"""`python -m benchmarks.burst`: a burst of requests sharing few prefixes, lpm against fcfs.

    .venv/bin/python -m benchmarks.burst [--workloads fewshot,rag] [--max-num-seqs 2,8] [--reps 3]
                         [--arrival burst|poisson] [--rate R] [--groups 8] [--per-group 8]
                         [--shared-words 950] [--question-words 60] [--max-tokens 16]
                         [--device-cache-size 96MiB] [--dtype bfloat16] [--max-model-len 2048]
                         [--out DIR] [--work-dir DIR] [--threads N] [--quick]

For each --max-num-seqs value it starts two tieredkv servers (`--schedule-policy lpm` and `fcfs`,
no host or disk tier), warms each up with one unrelated request, then per rep and workload runs,
each from a flushed cache: the grouped sequential run (on the lpm server), the lpm burst and the
fcfs burst, interleaved so that load on a shared machine hits all three alike. Targets per
workload and max-num-seqs: lpm hit tokens >= 90% of the tokens the prompts' shared prefixes
make reusable (counted by the client from its own prompts; the server's counts are
cross-checked against them) and lpm makespan < fcfs makespan (medians). Writes report.json and
summary.md to --out. `--quick`: tiny sizes for tests (figures meaningless); explicit flags
override it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import burst_summary
from benchmarks.burst_run import run_burst
from benchmarks.burst_workload import KINDS, BurstConfig, arrival_order, shared_prefix_tokens
from benchmarks.presets import fill_preset
from tieredkv.bench.client import ChatClient, served_model
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.records import fmt
from tieredkv.bench.result_file import machine_info
from tieredkv.config import CacheConfig
from tieredkv.errors import TieredKVError
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.tokenizer import ChatTokenizer

POLICIES = ("lpm", "fcfs")
PRESETS = {
    # the reference setting: 8 templates of ~1.2k tokens x 8 questions of ~100 tokens,
    # a 96 MiB bf16 device tier (~4.3k tokens of the default model: about 3 templates)
    "default": dict(workloads="fewshot,rag", max_num_seqs="2,8", reps=3, groups=8, per_group=8,
                    shared_words=950, question_words=60, max_tokens=16, device_cache="96MiB",
                    dtype="bfloat16", max_model_len=2048),
    # tests: a few seconds of requests; the figures mean nothing
    "quick": dict(workloads="fewshot,rag", max_num_seqs="2", reps=1, groups=2, per_group=2,
                  shared_words=60, question_words=10, max_tokens=4, device_cache="24MiB",
                  dtype="float32", max_model_len=512),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.burst", description=__doc__.split("\n")[0]
    )
    add = p.add_argument
    add("--workloads", help=f"comma-separated, of {', '.join(KINDS)}")
    add("--max-num-seqs", help="comma-separated server --max-num-seqs values")
    add("--reps", type=int)
    add("--arrival", choices=("burst", "poisson"), default="burst")
    add("--rate", type=float, help="Poisson arrivals per second (with --arrival poisson)")
    add("--groups", type=int, help="shared prefixes (templates or documents)")
    add("--per-group", type=int, help="requests per shared prefix")
    add("--shared-words", type=int, help="template or document (~1.3 tokens per word)")
    add("--question-words", type=int)
    add("--max-tokens", type=int)
    add("--seed", type=int, default=0)
    add("--device-cache-size", dest="device_cache")
    add("--dtype", choices=("float32", "bfloat16"))
    add("--max-model-len", type=int)
    add("--out", type=Path, help="output dir (default bench-results/burst-TIME)")
    add("--work-dir", type=Path, help="server logs (default: a temp dir)")
    add("--threads", type=int, help="OMP_NUM_THREADS of the servers")
    add("--quick", action="store_true", help="tiny sizes, for tests (figures meaningless)")
    return p


def resolve(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parsed flags, unset ones from the preset, lists split and checked (parser.error if not)."""
    args = parser.parse_args(argv)
    fill_preset(args, PRESETS)
    args.workloads = args.workloads.split(",")
    if not set(args.workloads) <= set(KINDS):
        parser.error(f"--workloads: expected some of {', '.join(KINDS)}, got {args.workloads}")
    try:
        args.max_num_seqs = [int(n) for n in args.max_num_seqs.split(",")]
    except ValueError:
        parser.error(f"--max-num-seqs: expected integers like 2,8, got {args.max_num_seqs!r}")
    if min(args.max_num_seqs) <= 0 or args.reps <= 0:
        parser.error("--max-num-seqs and --reps must be > 0")
    if (args.arrival == "poisson") != (args.rate is not None):
        parser.error("--rate R goes with --arrival poisson, and only with it")
    if args.rate is not None and args.rate <= 0:
        parser.error(f"--rate must be > 0, got {args.rate}")
    return args


def server_args(args: argparse.Namespace, policy: str, max_num_seqs: int) -> list[str]:
    return ["--schedule-policy", policy, "--max-num-seqs", str(max_num_seqs),
            "--device-cache-size", args.device_cache, "--host-cache-size", "0",
            "--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]  # fmt: skip


async def _warm_up(base_url: str) -> str:
    """One unrelated, untimed request; the served model's name."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = await served_model(http, base_url)
        record = await ChatClient(http, base_url, model).chat(
            [{"role": "user", "content": "Name three colours."}], 8, user=0, round_index=0
        )
    if record.error is not None:
        raise TieredKVError(f"warm-up request to {base_url} failed: {record.error}")
    return model


def run_seqs(args: argparse.Namespace, configs: list[BurstConfig], seqs: int, report: dict) -> None:
    """Both servers at one --max-num-seqs; every rep of every workload; runs into `report`."""
    work_dir = Path(report["work_dir"])
    with contextlib.ExitStack() as stack:
        servers, models = {}, {}
        for policy in POLICIES:
            argv = server_args(args, policy, seqs)
            log = work_dir / f"serve-{policy}-{seqs}.log"
            servers[policy] = stack.enter_context(ManagedServer(argv, log, args.threads))
            models[policy] = asyncio.run(_warm_up(servers[policy].base_url))
            report["servers"].append({"policy": policy, "max_num_seqs": seqs, "args": argv,
                                      "log": str(log)})  # fmt: skip
        # the servers run the default model with its default page size
        tokenizer = ChatTokenizer(default_model_dir())
        shared = {
            config.kind: shared_prefix_tokens(
                arrival_order(config), tokenizer.apply_chat_template, CacheConfig.page_size
            )
            for config in configs
        }
        for rep in range(args.reps):
            for config in configs:
                requests = arrival_order(config)
                for label, policy, mode in (
                    ("grouped", "lpm", "grouped"),
                    ("lpm", "lpm", args.arrival),
                    ("fcfs", "fcfs", args.arrival),
                ):
                    url = servers[policy].base_url
                    run = run_burst(url, models[policy], requests, config, mode,
                                    shared[config.kind], args.rate)  # fmt: skip
                    run |= {"workload": config.kind, "max_num_seqs": seqs, "rep": rep,
                            "label": label, "policy": policy}  # fmt: skip
                    report["runs"].append(run)
                    print(progress_line(run), flush=True)


def progress_line(run: dict) -> str:
    return (
        f"seqs {run['max_num_seqs']} rep {run['rep']} {run['workload']} {run['label']}: "
        f"hit {fmt(run['hit_tokens'], '.0f')} of {run['reusable_tokens']} reusable tokens, "
        f"makespan {fmt(run['makespan_s'], '.2f')} s, errors {run['errors']}"
    )


def finish(report: dict, out: Path) -> str:
    """Headline, targets and tables into `report`; write report.json and summary.md."""
    heads = burst_summary.headlines(report["runs"])
    report["headline"], report["targets"] = heads, burst_summary.targets(heads)
    report["tables"] = {
        "headline": burst_summary.headline_table(heads),
        "targets": burst_summary.targets_table(report["targets"]),
    }
    text = (
        f"# benchmarks/burst.py\n\n`{' '.join(report['command'])}`\n\n"
        f"## Runs (median of reps, min–max; TTFT pooled over reps)\n\n"
        f"{report['tables']['headline']}\n\n## Targets\n\n{report['tables']['targets']}\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return text


def main(argv: list[str]) -> int:
    args = resolve(build_parser(), argv)
    try:
        sizes = (args.groups, args.per_group, args.shared_words, args.question_words)
        configs = [BurstConfig(kind, *sizes, args.max_tokens, args.seed) for kind in args.workloads]
    except ValueError as exc:  # ConfigError names the field
        print(f"benchmarks/burst.py: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("bench-results") / time.strftime("burst-%Y%m%d-%H%M%S")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tieredkv-burst-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report = {
        "command": ["python", "-m", "benchmarks.burst", *argv],
        "settings": settings,
        "workloads": [dataclasses.asdict(c) for c in configs],
        "machine": machine_info(),
        "work_dir": str(work_dir),
        "servers": [],
        "runs": [],
    }
    try:
        for seqs in args.max_num_seqs:
            run_seqs(args, configs, seqs, report)
    except (TieredKVError, OSError, httpx.HTTPError) as exc:
        print(f"benchmarks/burst.py: error: {exc}", file=sys.stderr)
        finish(report, out)
        print(f"partial report: {out / 'report.json'}", file=sys.stderr)
        return 1
    print(finish(report, out))
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

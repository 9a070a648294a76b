"""`tieredkv bench multiturn`: many users' long conversations against OpenAI-compatible servers.

With `--base-url URL` it only drives that server (any OpenAI-compatible one; `--baseline-url`
adds a recompute server to compare with). Without it, the benchmark starts tieredkv itself:
one configuration and the recompute baseline (`--no-cache`, same binary) unless
`--no-baseline`. Writes report.json and summary.md to `--out`. Presets: `--preset
quick` (1-2 minutes) and `--preset default` (a few minutes on a 2-core machine); explicit
flags override a preset. (benchmarks/ has scripts that run the same workload otherwise.)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tieredkv.bench import report as reports
from tieredkv.bench.disk_check import disk_read_limit, drop_page_cache
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.prefill_cost import load_model_cost
from tieredkv.bench.suite import ServerSpec, SuiteConfig, run_all, run_server
from tieredkv.bench.targets import evaluate
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.bench.workload_run import run_workload
from tieredkv.config import WritePolicy
from tieredkv.errors import TieredKVError

PRESETS = {
    # quick: ~1-2 min on 2 cores; 6 conversations of ~560 tokens over a 48+16 MiB fp32 budget,
    # so part of every round's history comes back from disk
    "quick": dict(users=6, rounds=3, system_words=60, document_words=300, max_tokens=16,
                  device_cache="48MiB", host_cache="16MiB", disk_cache="1GiB", max_model_len=1024),
    # default: a few minutes; 6 conversations of 3.2k-3.5k tokens (~0.95 GB of fp32 KV) over a
    # 256 MiB device + host budget (the device holds one 4096-token sequence): histories come
    # back from host and disk
    "default": dict(users=6, rounds=3, system_words=150, document_words=2400, max_tokens=32,
                    device_cache="192MiB", host_cache="64MiB", disk_cache="4GiB",
                    max_model_len=4096),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tieredkv bench multiturn", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--preset", choices=sorted(PRESETS), default="default")
    add("--users", type=int)
    add("--rounds", type=int)
    add("--system-words", type=int)
    add("--document-words", type=int, help="per-user document (~1.3 tokens per word)")
    add("--max-tokens", type=int)
    add("--seed", type=int, default=0)
    add("--concurrency", type=int, default=1)
    add(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrivals per second (default: round-robin)",
    )
    add("--ignore-eos", action="store_true", help="send ignore_eos (fixed answer lengths)")
    add("--out", type=Path, default=None, help="output dir (default bench-results/multiturn-TIME)")
    add("--dtype", choices=("float32", "bfloat16"), default="float32",
        help="servers' dtype (the targets' KV bytes follow it)")  # fmt: skip
    client = p.add_argument_group("an existing server")
    client.add_argument("--base-url", help="drive this server only (no managed runs)")
    client.add_argument("--model", help="model name to request (default: the first of /v1/models)")
    client.add_argument("--label", default="server")
    client.add_argument("--baseline-url", help="a recompute server running the same model")
    client.add_argument("--disk-cache-dir", type=Path, help="the server's disk store, to drop "
                        "from the page cache before each round (same machine only)")  # fmt: skip
    managed = p.add_argument_group("managed tieredkv runs")
    managed.add_argument("--serve-model", help="tieredkv serve --model; the targets count its "
                         "FLOPs and KV bytes (default: the default model)")  # fmt: skip
    managed.add_argument("--max-model-len", type=int)
    managed.add_argument("--device-cache-size", dest="device_cache")
    managed.add_argument("--host-cache-size", dest="host_cache")
    managed.add_argument("--disk-cache-size", dest="disk_cache")
    managed.add_argument("--page-size", type=int, default=None)
    managed.add_argument("--write-policy", choices=[p.value for p in WritePolicy], default=None)
    managed.add_argument("--no-baseline", action="store_true")
    managed.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of servers")
    managed.add_argument("--work-dir", type=Path, help="logs and disk stores (default: a temp dir)")
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill every flag left unset from the preset."""
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


# runs the managed configurations: (args, base spec, suite, workload, arrival, report) -> runs
RunConfigs = Callable[
    [argparse.Namespace, ServerSpec, SuiteConfig, Workload, ArrivalConfig, dict], list[dict]
]
# adds its own figures to the report once every run is done: (report, runs, baseline)
AfterRuns = Callable[[dict, list[dict], dict | None], None]


def main(
    argv: list[str],
    parser: argparse.ArgumentParser | None = None,
    run_configs: RunConfigs | None = None,
    after_runs: AfterRuns | None = None,
) -> int:
    """Run the benchmark. A script (benchmarks/replicas.py) passes its own `parser` (more
    flags), `run_configs` (other configurations of the managed servers, same workload) and
    `after_runs` (its own analysis and report sections)."""
    parser = parser or build_parser()
    args = resolve(parser.parse_args(argv))
    try:
        workload = WorkloadConfig(
            args.users, args.rounds, args.system_words, args.document_words, args.max_tokens,
            args.seed,
        )  # fmt: skip
        arrival = ArrivalConfig(args.concurrency, args.rate)
    except ValueError as exc:
        parser.error(str(exc))
    out = args.out or Path("bench-results") / time.strftime("multiturn-%Y%m%d-%H%M%S")
    report = reports.new_report([parser.prog, *argv], workload, arrival)
    try:
        if args.base_url:
            run_client(args, Workload(workload), arrival, report)
        else:
            runner = run_configs or run_base
            run_managed(args, Workload(workload), arrival, report, runner, after_runs)
        print(reports.finish(report, out))
    except (TieredKVError, OSError, httpx.HTTPError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        if report["runs"]:
            reports.finish(report, out)
            print(f"partial report: {out / 'report.json'}", file=sys.stderr)
        return 1
    print(f"report: {out / 'report.json'}")
    return 0


def run_client(
    args: argparse.Namespace, workload: Workload, arrival: ArrivalConfig, report: dict
) -> None:
    extra = {"ignore_eos": True} if args.ignore_eos else None
    disk_dir = args.disk_cache_dir

    def before_round(_round: int) -> None:
        if disk_dir is not None:
            drop_page_cache(disk_dir)

    run = run_workload(
        args.base_url, workload, arrival, before_round, args.label, args.model, extra
    )
    report["runs"].append(run)
    baseline = None
    if args.baseline_url:
        baseline = run_workload(
            args.baseline_url, workload, arrival, None, "recompute", args.model, extra
        )
        report["runs"].append(baseline)
        report["baseline_label"] = "recompute"
    if disk_dir is not None:
        # probe beside the store, not inside the directory the server owns
        report["disk"] = disk_read_limit(disk_dir.resolve().parent)
    finish_analysis(args, report, [run], baseline)


def run_base(
    _args: argparse.Namespace,
    spec: ServerSpec,
    suite: SuiteConfig,
    workload: Workload,
    arrival: ArrivalConfig,
    report: dict,
) -> list[dict]:
    """The one configuration the flags describe."""
    return run_all([spec], suite, workload, arrival, on_result=report["runs"].append)


def run_managed(
    args: argparse.Namespace,
    workload: Workload,
    arrival: ArrivalConfig,
    report: dict,
    run_configs: RunConfigs,
    after_runs: AfterRuns | None = None,
) -> None:
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="tieredkv-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    common = ["--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]
    common += ["--max-num-seqs", str(max(args.concurrency, 1) + 2)]
    if args.serve_model:
        common += ["--model", args.serve_model]
    extra = {"ignore_eos": True} if args.ignore_eos else None
    suite = SuiteConfig(common, work_dir, args.threads, extra_body=extra)
    report["work_dir"] = str(work_dir)
    report["disk"] = disk_read_limit(suite.work_dir, suite.disk_probe_bytes)
    base_spec = ServerSpec("tieredkv", args.device_cache, args.host_cache, args.disk_cache,
                      args.page_size, args.write_policy)  # fmt: skip
    # each run joins the report as it finishes: a partial report keeps the finished ones
    runs = run_configs(args, base_spec, suite, workload, arrival, report)
    baseline = None
    if not args.no_baseline:
        spec = dataclasses.replace(base_spec, label="recompute", no_cache=True)
        baseline = run_server(spec, suite, workload, arrival)
        report["runs"].append(baseline)
        report["baseline_label"] = "recompute"
    finish_analysis(args, report, runs, baseline)
    if after_runs is not None:
        after_runs(report, runs, baseline)


def finish_analysis(
    args: argparse.Namespace, report: dict, runs: list[dict], baseline: dict | None
) -> None:
    """The targets of the runs of `report`."""
    disk_bw = report["disk"]["bytes_per_s"] if report["disk"] else None
    # the served model's FLOPs and KV bytes per token: the local model the flags name
    cost = load_model_cost(args.serve_model, args.dtype, args.page_size)
    report["targets"] = evaluate(runs[0], baseline, disk_bw, cost)
    report["targets_by_run"] = {
        run["label"]: evaluate(run, baseline, disk_bw, cost) for run in runs
    }

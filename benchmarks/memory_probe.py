"""Peak resident memory of a server under concurrent long prompts, against weights + tiers.

Starts `tieredkv serve` (this checkout's code) with the given tiers, sends `--requests`
concurrent prompts of `--prompt-tokens` distinct random token ids each (`/v1/completions`,
`max_tokens` `--max-tokens`), and samples the resident memory of the server's process tree
(`TreeMemory`) while they run. The limit is the weights (the model file's tensor shapes at the
served dtype, computed from its safetensors header) plus the configured device and host tiers,
plus 10%. Beside it: the tree's idle resident memory after start-up (Python, torch, the
weights as the matrix products read them; the tiers as far as prefaulted), the attention
workspaces' budget and their highest resident bytes seen in `/health` during the run, and
where the memory sat, idle and at the peak, by kind of mapping (`memory_breakdown`), so that a
miss names its cause.

    python -m benchmarks.memory_probe [--device-cache-size 1GiB --host-cache-size 1GiB]
        [--requests 16 --prompt-tokens 5000 --max-tokens 16] [--out DIR]

`render_markdown` turns its committed result files into a section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.memory_breakdown import KINDS, MemorySampler, tree_breakdown
from benchmarks.vllm_compare.peers import TreeMemory
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.records import fmt
from tieredkv.bench.result_file import machine_line, write_result
from tieredkv.config import parse_size
from tieredkv.errors import TieredKVError
from tieredkv.model.loader import resolve_model_dir

ALLOWANCE = 0.10  # the rule: peak RSS at most weights + tiers + 10%
IDLE_SAMPLE_S = 2.0
HEALTH_INTERVAL_S = 0.25
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GIB = 1 << 30


def weights_bytes(model: str | None, dtype: str) -> int:
    """The model's tensor bytes at `dtype`: every tensor's element count from the safetensors
    headers of its directory, times the element size."""
    elements = 0
    for path in sorted(resolve_model_dir(model).glob("*.safetensors")):
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        elements += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return elements * ELEMENT_BYTES[dtype]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the server's default model")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(ELEMENT_BYTES))
    parser.add_argument("--device-cache-size", default="1GiB")
    parser.add_argument("--host-cache-size", default="1GiB")
    parser.add_argument("--workspace-size", default=None, help="default: the server's")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=5000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="a folder for result.json")
    return parser


def server_args(args: argparse.Namespace) -> list[str]:
    flags = ["--dtype", args.dtype, "--max-num-seqs", str(args.requests)]
    flags += ["--device-cache-size", args.device_cache_size]
    flags += ["--host-cache-size", args.host_cache_size]
    if args.model:
        flags += ["--model", args.model]
    if args.workspace_size:
        flags += ["--workspace-size", args.workspace_size]
    return flags


async def send_all(base_url: str, args: argparse.Namespace) -> list[dict]:
    """The prompts at once; each one's seconds and completion tokens."""
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(args.prompt_tokens)]]
    prompts += [[rng.randrange(100, 40000) for _ in range(args.prompt_tokens)]
                for _ in range(args.requests - 1)]  # fmt: skip

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> dict:
        start = time.perf_counter()
        body = {"prompt": prompt, "max_tokens": args.max_tokens, "ignore_eos": True}
        response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        tokens = response.json()["usage"]["completion_tokens"]
        return {"seconds": time.perf_counter() - start, "completion_tokens": tokens}

    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as client:
        return list(await asyncio.gather(*(one(client, p) for p in prompts)))


class WorkspaceWatch:
    """The highest `/health` workspace resident bytes seen while it runs (a thread)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.peak_resident_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(HEALTH_INTERVAL_S):
            try:
                workspace = httpx.get(self.base_url + "/health", timeout=5).json()["workspace"]
            except (httpx.HTTPError, KeyError, TypeError):
                continue
            self.peak_resident_bytes = max(self.peak_resident_bytes, workspace["resident_bytes"])

    def __enter__(self) -> WorkspaceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def probe(args: argparse.Namespace, work_dir: Path) -> tuple[dict, list[dict]]:
    """Run the server and the prompts; the summary and one record a request."""
    with ManagedServer(server_args(args), work_dir / "server.log", args.threads) as server:
        pid = server.process.pid
        with TreeMemory(pid) as idle:
            time.sleep(IDLE_SAMPLE_S)
        idle_breakdown = tree_breakdown(pid)
        health = httpx.get(server.base_url + "/health", timeout=30).json()
        watch, sampler = WorkspaceWatch(server.base_url), MemorySampler(pid)
        with TreeMemory(pid) as loaded, watch, sampler:
            records = asyncio.run(send_all(server.base_url, args))
    weights = weights_bytes(args.model, args.dtype)
    tiers = parse_size(args.device_cache_size) + parse_size(args.host_cache_size)
    limit = int((weights + tiers) * (1 + ALLOWANCE))
    peak = loaded.result()["peak_rss_bytes"]
    summary = {
        "weights_bytes": weights,
        "tiers_bytes": tiers,
        "limit_bytes": limit,
        "idle_rss_bytes": idle.result()["peak_rss_bytes"],
        "peak_rss_bytes": peak,
        "processes": loaded.result()["processes"],
        "capacity": health["capacity"]["memory_bytes"],
        "workspace_budget_bytes": (health.get("workspace") or {}).get("budget_bytes", 0),
        "workspace_peak_resident_bytes": watch.peak_resident_bytes,
        "idle_breakdown_bytes": idle_breakdown,
        "breakdown_bytes": sampler.peak,
        "met": peak <= limit,
    }
    return summary, records


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or Path("bench-results") / time.strftime("memory_probe-%Y%m%d-%H%M%S")
    work_dir = Path(tempfile.mkdtemp(prefix="tieredkv-memory-probe-"))
    try:
        summary, records = probe(args, work_dir)
    except (TieredKVError, OSError, httpx.HTTPError) as exc:
        print(f"benchmarks/memory_probe.py: error: {exc} (server log: {work_dir})", file=sys.stderr)
        return 1
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings["server_args"] = server_args(args)
    argv_full = ["python", "-m", "benchmarks.memory_probe", *argv]
    path = write_result(out, "memory_probe", settings=settings, summary=summary, records=records,
                        argv=argv_full)  # fmt: skip
    print(render_markdown([{**json.loads(path.read_text()), "dir": str(out)}]))
    print(f"result: {path}")
    return 0


def _gib(value: int) -> str:
    return fmt(value / GIB, ".2f")


def _breakdown_table(results: list[dict]) -> list[str]:
    """Where the resident memory sat, idle and at the sampled peak (`memory_breakdown`'s kinds:
    heap = tensors and Python objects, shared anonymous = the host tier, anonymous = the
    workspace and other mappings of their own)."""
    rows = [r for r in results if "breakdown_bytes" in r["summary"]]
    if not rows:
        return []
    kinds = " | ".join(kind.replace("_", " ") for kind in KINDS)
    parts = [
        "\nResident memory by kind of mapping (`benchmarks/memory_breakdown.py`), idle / at the "
        "sampled peak: heap = the allocator's heap (weights, device tier, activations, Python "
        "objects), shared anonymous = the host tier, anonymous = the attention workspace and "
        "other mappings of their own. GiB.\n",
        f"| run | {kinds} |",
        "| --- |" + " --- |" * len(KINDS),
    ]
    for result in rows:
        s = result["summary"]
        cells = [
            f"{_gib(s['idle_breakdown_bytes'].get(kind, 0))} / {_gib(s['breakdown_bytes'][kind])}"
            for kind in KINDS
        ]
        parts.append(f"| `{result['dir']}` | " + " | ".join(cells) + " |")
    return parts


def render_markdown(results: list[dict]) -> str:
    """The memory section: one row a run, peak RSS beside the limit it is judged by."""
    parts = [
        "## Memory under concurrent long prompts\n",
        "`python -m benchmarks.memory_probe`: concurrent prompts of distinct random tokens; the "
        "peak resident memory of the server's processes against the weights (the model file's "
        "tensors at the served dtype) plus the configured device and host tiers plus 10%. Idle: "
        "after start-up, before any request (Python, torch, the weights as the products read "
        "them, the tiers as far as written or prefaulted). The workspaces are "
        "carved out of the device tier; their column is their budget and the most `/health` "
        "showed resident. GiB throughout.\n",
        "| run | prompts | tiers (device + host) | weights | limit | idle RSS | peak RSS | "
        "peak / limit | workspace budget / resident | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        s, settings = result["summary"], result["settings"]
        prompts = f"{settings['requests']} x {settings['prompt_tokens']}"
        tiers = f"{settings['device_cache_size']} + {settings['host_cache_size']}"
        workspace = (
            f"{_gib(s['workspace_budget_bytes'])} / {_gib(s['workspace_peak_resident_bytes'])}"
        )
        parts.append(
            f"| `{result['dir']}` | {prompts} | {tiers} | {_gib(s['weights_bytes'])} | "
            f"{_gib(s['limit_bytes'])} | {_gib(s['idle_rss_bytes'])} | {_gib(s['peak_rss_bytes'])} "
            f"| {fmt(s['peak_rss_bytes'] / s['limit_bytes'], '.2f')} | {workspace} | "
            f"{'yes' if s['met'] else 'no'} |"
        )
    parts += _breakdown_table(results)
    machines = sorted({machine_line(result) for result in results})
    parts.append("\nMachine: " + "; ".join(machines) + ".")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""tieredkv against vLLM's CPU build, one server at a time, same client, same prompts, one run.

Measures what a user feels through the HTTP API (token-id prompts on /v1/completions, so both
servers see exactly the same tokens):

- cold prefill: a prompt no server has seen, max_tokens=1; tokens / TTFT (2k and 8k tokens)
- warm turn: a history sent once, then history + a new 64-token question; the second TTFT
  (histories of 1k, 2k, 4k and 7.5k tokens; everything fits in the KV budget)
- decode: one stream at ~2.7k tokens of context, and 8 concurrent streams at ~1k, 256 tokens
  each; timed over the window in which every stream is decoding (from the last stream's first
  token to the first stream's last token), so no prefill shares a step with the decodes:
  ms/token is the window over a stream's tokens in it, throughput all tokens in it over it

Before each section one untimed request of the section's shape warms the server up (both
servers get the same requests).

With `--overflow`, many users' long chats whose histories together are ~3.7x the KV budget
(tieredkv: 768 MiB device + 256 MiB host + a disk tier; vLLM: 1 GiB of KV), round-robin, three
rounds: TTFT of the reuse rounds (2 and 3) from per-request timings.

And, for tieredkv alone, where a cache hit's time goes (`--tiers`): histories of 3k tokens are
sent, the server is restarted (its disk index rebuilt, the store dropped from the page cache),
and the next turn of each history is timed with the history on disk, then another turn with it
already on the device, then the same turn recomputed (a fresh `cache_salt`). The rule: TTFT with
the history on disk <= TTFT with it on the device + 1.5 x (bytes / disk read bandwidth), the
bandwidth measured in the same run at the store's request sizes and requests in flight (the best
of three shapes), before and after the turns, the faster of the two (this shared disk's speed
drifts within minutes).

Each figure is the median of `--repeats` fresh prompts, with min and max, and beside it the most
cores others took during any of its samples: other processes on this shared machine and the
hypervisor's steal (`OtherLoad`: a sample slowed by a neighbour shows). vLLM runs as its docs
recommend for CPUs (benchmarks/vllm_cpu.sh: tcmalloc and Intel OpenMP preloaded, OMP threads
bound to the cores). Run:

    benchmarks/vllm_cpu.sh install      # once
    .venv/bin/python benchmarks/vs_vllm.py --out bench-results/vs-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from tieredkv.bench.disk_check import disk_read_limit, drop_page_cache
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.machine_load import OtherLoad
from tieredkv.bench.managed import ManagedServer, free_port
from tieredkv.bench.prom_text import Samples, counter_delta, parse_samples, select
from tieredkv.bench.records import percentile
from tieredkv.bench.workload import Workload, WorkloadConfig, prose
from tieredkv.bench.workload_run import run_workload
from tieredkv.cache.page_layout import PageLayout
from tieredkv.model.default_model import default_model_dir
from tieredkv.model.hf_config import parse_model_config, read_config_json
from tieredkv.model.tokenizer import ChatTokenizer

HERE = Path(__file__).resolve().parent
PREFILL_LENGTHS = (2048, 8000)
HISTORY_LENGTHS = (1024, 2048, 4096, 7500)
QUESTION_TOKENS = 64
DECODE_TOKENS = 256
MAX_MODEL_LEN = 8192
TIER_HISTORY_TOKENS = 3072
PAGE_SIZE = 16


class Prompts:
    """Token-id prompts cut from seeded prose: every call returns tokens never sent before."""

    def __init__(self, seed: int) -> None:
        self.tokenizer = ChatTokenizer(default_model_dir())
        self.rng = random.Random(seed)

    def fresh(self, num_tokens: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < num_tokens:
            ids += self.tokenizer.encode(prose(self.rng, 2000), add_special_tokens=False)
        return ids[:num_tokens]


async def stream(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    prompt: list[int],
    max_tokens: int,
    salt: str | None = None,
) -> dict:
    """One streamed completion: TTFT, the arrival time of every token, usage."""
    body: dict = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if salt is not None:
        body["cache_salt"] = salt
    start = time.perf_counter()
    times: list[float] = []
    usage = None
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    times.append(time.perf_counter() - start)
    if not times:
        raise RuntimeError(f"{url}: no tokens streamed")
    return {"ttft_s": times[0], "token_times_s": times, "usage": usage, "request_start_s": start}


def decode_window(records: list[dict]) -> tuple[float, float]:
    """(median ms/token of a stream, tokens/s of all) while every stream was decoding."""
    starts = [r["request_start_s"] + r["token_times_s"][0] for r in records]
    ends = [r["request_start_s"] + r["token_times_s"][-1] for r in records]
    begin, end = max(starts), min(ends)
    counts = [
        sum(1 for t in r["token_times_s"] if begin < r["request_start_s"] + t <= end)
        for r in records
    ]
    if end <= begin or min(counts) == 0:
        raise RuntimeError("the streams never decoded together: raise DECODE_TOKENS")
    ms_per_token = statistics.median((end - begin) * 1000 / count for count in counts)
    return ms_per_token, sum(counts) / (end - begin)


def spread(values: list[float], others: list[float | None] | None = None) -> dict:
    """Median, min and max of `values`; with `others` (each sample's
    `OtherLoad.others_cores`), the most cores the rest of the machine took during any of them."""
    result = {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }
    known = [cores for cores in others or () if cores is not None]
    if known:
        result["others_cores_max"] = max(known)
    return result


async def measure(url: str, prompts: Prompts, repeats: int, server_pid: int) -> dict:
    """Every figure for the server at `url`; beside each, the cores processes other than the
    server (`server_pid` and its children) and this client took during its samples."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        await stream(http, url, model, prompts.fresh(256), 4)  # warm-up
        result: dict = {"prefill_tok_per_s": {}, "warm_ttft_s": {}, "decode": {}}
        for length in PREFILL_LENGTHS:
            await stream(http, url, model, prompts.fresh(length), 1)  # warm-up
            speeds, others = [], []
            for _ in range(repeats):
                with OtherLoad([server_pid]) as load:
                    record = await stream(http, url, model, prompts.fresh(length), 1)
                speeds.append(length / record["ttft_s"])
                others.append(load.others_cores)
            result["prefill_tok_per_s"][length] = spread(speeds, others)
            print(f"  cold prefill {length}: {statistics.median(speeds):.0f} tok/s", flush=True)
        for length in HISTORY_LENGTHS:
            ttfts, cached, others = [], [], []
            for repeat in range(repeats + 1):  # the first is a warm-up
                history = prompts.fresh(length)
                await stream(http, url, model, history, 1)
                turn = history + prompts.fresh(QUESTION_TOKENS)
                with OtherLoad([server_pid]) as load:
                    record = await stream(http, url, model, turn, 1)
                if repeat == 0:
                    continue
                ttfts.append(record["ttft_s"])
                others.append(load.others_cores)
                details = (record["usage"] or {}).get("prompt_tokens_details") or {}
                cached.append(details.get("cached_tokens"))
            result["warm_ttft_s"][length] = {**spread(ttfts, others), "cached_tokens": cached}
            print(f"  warm turn {length}: {statistics.median(ttfts) * 1000:.0f} ms", flush=True)
        for streams, context in ((1, 2700), (8, 1024)):
            per_token, throughput, others = [], [], []
            for repeat in range(repeats + 1):  # the first is a warm-up
                with OtherLoad([server_pid]) as load:  # the prefills too: a close bound
                    records = await asyncio.gather(
                        *(
                            stream(http, url, model, prompts.fresh(context), DECODE_TOKENS)
                            for _ in range(streams)
                        )
                    )
                if repeat == 0:
                    continue
                ms_per_token, tokens_per_s = decode_window(records)
                per_token.append(ms_per_token)
                throughput.append(tokens_per_s)
                others.append(load.others_cores)
            result["decode"][streams] = {
                "context_tokens": context,
                "ms_per_token": spread(per_token, others),
                "tokens_per_s": spread(throughput, others),
            }
            print(
                f"  decode x{streams}: {statistics.median(per_token):.1f} ms/token, "
                f"{statistics.median(throughput):.1f} tok/s",
                flush=True,
            )
        return result


OVERFLOW_USERS = 48  # ~80 MB of bf16 KV each by round 3: ~3.7x a 1 GiB budget


def overflow_run(url: str, label: str, seed: int) -> dict:
    workload = Workload(WorkloadConfig(OVERFLOW_USERS, 3, 150, 2400, 32, seed))
    run = run_workload(url, workload, ArrivalConfig(1, None), label=label)
    reuse = [r for r in run["records"] if r["round_index"] >= 1 and r["ttft_s"] is not None]
    ttfts = [r["ttft_s"] for r in reuse]
    summary = {
        "requests": len(reuse),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "hit_ratio": run["summary"]["reuse_rounds"]["hit_ratio"],
        "round1_ttft_p50_s": run["summary"]["by_round"][0]["ttft_s"]["p50"],
    }
    print(
        f"  overflow ({label}): reuse-round TTFT p50 {summary['ttft_p50_s'] * 1000:.0f} ms over"
        f" {len(reuse)} requests, hit ratio {summary['hit_ratio']}",
        flush=True,
    )
    return {"summary": summary, "run": run}


def page_bytes() -> int:
    model_dir = default_model_dir()
    config = parse_model_config(read_config_json(model_dir), model_dir)
    return PageLayout.for_model(config, PAGE_SIZE, torch.bfloat16).page_bytes


async def metrics(http: httpx.AsyncClient, url: str) -> Samples:
    return parse_samples((await http.get(url + "/metrics")).text)


async def settled_metrics(http: httpx.AsyncClient, url: str) -> Samples:
    """/metrics once the engine is idle: the engine thread mirrors the cache's counters at the
    end of a step, after the step's tokens went out, so a scrape right after the first token
    can miss that step's transfers (a disk turn once read "0 bytes"). Two equal scrapes 20 ms
    apart (at most 2 s of trying)."""
    last = await metrics(http, url)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = await metrics(http, url)
        if now == last:
            break
        last = now
    return last


async def transfer_bytes(http: httpx.AsyncClient, url: str, **labels: str) -> float:
    samples = await metrics(http, url)
    return sum(select(samples, "tieredkv_transfer_bytes_total", **labels).values())


def server_split(before: Samples, after: Samples, ttft_s: float) -> dict:
    """Where one request's TTFT went, by the server's own sums: waiting (arrival to first
    forward, which includes the promotion), the promotion itself, and the rest (the forward)."""
    queue = counter_delta(before, after, "tieredkv_queue_seconds_sum") or 0.0
    promotion = counter_delta(before, after, "tieredkv_promotion_seconds_sum") or 0.0
    return {"queue_s": queue, "promotion_s": promotion, "after_queue_s": ttft_s - queue}


async def send_histories(url: str, histories: list[list[int]]) -> None:
    """Compute every history once, then wait until write-through has put it all on disk."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        for history in histories:
            await stream(http, url, model, history, 1)
        wanted = sum(len(h) // PAGE_SIZE for h in histories) * page_bytes()
        deadline = time.monotonic() + 120
        while await transfer_bytes(http, url, to_tier="disk") < wanted:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)


async def turns_by_tier(
    url: str, histories: list[list[int]], prompts: Prompts, server_pid: int
) -> list[dict]:
    """Per history: a turn with it on disk, one with it on the device, one recomputed; beside
    the first two, the cores other processes took during each."""
    rows = []
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        # warm-up: a fresh server's first long request pays one-time costs (first-touch
        # buffers); an unrelated prompt of the same shape pays them, not the first history
        await stream(http, url, model, prompts.fresh(TIER_HISTORY_TOKENS + QUESTION_TOKENS), 1)
        for i, history in enumerate(histories):
            turn = history + prompts.fresh(QUESTION_TOKENS)
            before = await settled_metrics(http, url)
            with OtherLoad([server_pid]) as disk_load:
                on_disk = await stream(http, url, model, turn, 1)
            after = await settled_metrics(http, url)
            disk_bytes_read = counter_delta(
                before, after, "tieredkv_transfer_bytes_total", from_tier="disk"
            )
            with OtherLoad([server_pid]) as device_load:
                next_turn = history + prompts.fresh(QUESTION_TOKENS)
                on_device = await stream(http, url, model, next_turn, 1)
            after_device = await settled_metrics(http, url)
            recomputed = await stream(http, url, model, turn, 1, salt=f"recompute-{i}")
            details = on_disk["usage"]["prompt_tokens_details"]
            rows.append(
                {
                    "disk_ttft_s": on_disk["ttft_s"],
                    "device_ttft_s": on_device["ttft_s"],
                    "recompute_ttft_s": recomputed["ttft_s"],
                    "disk_cached_by_tier": details["cached_tokens_by_tier"],
                    "disk_bytes_read": disk_bytes_read or 0.0,
                    "disk_split": server_split(before, after, on_disk["ttft_s"]),
                    "device_split": server_split(after, after_device, on_device["ttft_s"]),
                    "disk_others_cores": disk_load.others_cores,
                    "device_others_cores": device_load.others_cores,
                    "disk_steal_cores": disk_load.steal_cores,
                    "device_steal_cores": device_load.steal_cores,
                    "device_cached_by_tier": on_device["usage"]["prompt_tokens_details"][
                        "cached_tokens_by_tier"
                    ],
                }
            )
    return rows


def measure_tiers(out: Path, prompts: Prompts, repeats: int) -> dict:
    disk_dir = out / "kv"
    serve_args = ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
    serve_args += ["--device-cache-size", "1GiB", "--host-cache-size", "1GiB"]
    serve_args += ["--disk-cache-dir", str(disk_dir), "--disk-cache-size", "4GiB"]
    histories = [prompts.fresh(TIER_HISTORY_TOKENS) for _ in range(repeats)]
    with ManagedServer(serve_args, out / "tieredkv-tiers-1.log") as server:
        asyncio.run(send_histories(server.base_url, histories))
    before = disk_read_limit(out)
    with ManagedServer(serve_args, out / "tieredkv-tiers-2.log") as server:
        drop_page_cache(disk_dir)
        rows = asyncio.run(turns_by_tier(server.base_url, histories, prompts, server.process.pid))
    after = disk_read_limit(out)
    shutil.rmtree(disk_dir)  # a preallocated 4 GiB store: a few runs would fill the disk
    # this shared disk's speed drifts within minutes (session 12: the same probe read 0.86 GB/s
    # in one run and 2.15 a few minutes later, and promotions beat a probe taken before them):
    # the faster of a probe before and one after the turns is the limit (the stricter rule)
    bandwidth = max(before, after, key=lambda probe: probe["bytes_per_s"])
    bandwidth = {**bandwidth, "probes_bytes_per_s": [before["bytes_per_s"], after["bytes_per_s"]]}
    print(
        f"  disk read limit: {before['bytes_per_s'] / 1e9:.2f} GB/s before the turns, "
        f"{after['bytes_per_s'] / 1e9:.2f} after (best shapes: {before['chunk_bytes'] >> 20} MiB x "
        f"{before['in_flight']}, {after['chunk_bytes'] >> 20} MiB x {after['in_flight']})",
        flush=True,
    )
    for row in rows:
        disk_bytes = row["disk_cached_by_tier"]["disk"] // PAGE_SIZE * page_bytes()
        row["disk_bytes"] = disk_bytes
        row["read_ideal_s"] = disk_bytes / bandwidth["bytes_per_s"]
        row["bound_s"] = row["device_ttft_s"] + 1.5 * row["read_ideal_s"]
        row["met"] = row["disk_ttft_s"] <= row["bound_s"]
        print(
            f"  history on disk {row['disk_ttft_s'] * 1000:.0f} ms, on device "
            f"{row['device_ttft_s'] * 1000:.0f} ms, recomputed {row['recompute_ttft_s'] * 1000:.0f}"
            f" ms; read ideal {row['read_ideal_s'] * 1000:.0f} ms; bound "
            f"{row['bound_s'] * 1000:.0f} ms: {'met' if row['met'] else 'NOT met'}; read "
            f"{row['disk_bytes_read'] / row['disk_bytes']:.2f}x the history's bytes",
            flush=True,
        )
        for where in ("disk", "device"):
            split, others = row[f"{where}_split"], row[f"{where}_others_cores"]
            steal = row[f"{where}_steal_cores"]
            print(
                f"    {where}: queued {split['queue_s'] * 1000:.0f} ms (promotion "
                f"{split['promotion_s'] * 1000:.0f} ms), then {split['after_queue_s'] * 1000:.0f}"
                f" ms to the first token; others took "
                f"{'?' if others is None else f'{others:.2f} cores (steal {steal:.2f})'}",
                flush=True,
            )
    return {"disk_read": bandwidth, "turns": rows}


def start_vllm(kv_gib: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, DTYPE="bfloat16", MAX_MODEL_LEN=str(MAX_MODEL_LEN))
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [str(HERE / "vllm_cpu.sh"), "serve", str(kv_gib), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited: see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(2)
    process.terminate()
    raise RuntimeError(f"vLLM did not start in 600 s: see {log_path}")


def targets_table(report: dict) -> str:
    """The issue's targets from the report's raw figures (medians), each beside its rule."""
    ours, peer = report.get("tieredkv"), report.get("vllm")
    rows = ["| target | tieredkv | vLLM | ratio | rule | met |", "|---|---|---|---|---|---|"]

    def row(name: str, mine: float, theirs: float, unit: str, rule: str, met: bool) -> None:
        rows.append(
            f"| {name} | {mine:,.1f} {unit} | {theirs:,.1f} {unit} | {mine / theirs:.2f}x "
            f"| {rule} | {'yes' if met else 'NO'} |"
        )

    if ours and peer:
        for length, theirs in peer["prefill_tok_per_s"].items():
            mine = ours["prefill_tok_per_s"][length]["median"]
            rule = ">= 0.8x vLLM"
            row(
                f"cold prefill {length}",
                mine,
                theirs["median"],
                "tok/s",
                rule,
                mine >= 0.8 * theirs["median"],
            )
        for length, theirs in peer["warm_ttft_s"].items():
            mine = ours["warm_ttft_s"][length]["median"] * 1000
            rule = "<= 1.0x vLLM"
            row(
                f"warm turn TTFT, {length}-token history",
                mine,
                theirs["median"] * 1000,
                "ms",
                rule,
                mine <= theirs["median"] * 1000,
            )
        for streams, theirs in peer["decode"].items():
            mine = ours["decode"][streams]
            ms, their_ms = mine["ms_per_token"]["median"], theirs["ms_per_token"]["median"]
            row(f"decode x{streams}, ms/token", ms, their_ms, "ms", "<= 1.0x vLLM", ms <= their_ms)
            tps, their_tps = mine["tokens_per_s"]["median"], theirs["tokens_per_s"]["median"]
            row(
                f"decode x{streams}, throughput",
                tps,
                their_tps,
                "tok/s",
                ">= vLLM",
                tps >= their_tps,
            )
    tiers = report.get("tiers")
    if tiers:
        turns = tiers["turns"]
        met = sum(t["met"] for t in turns)
        disk = statistics.median(t["disk_ttft_s"] for t in turns) * 1000
        bound = statistics.median(t["bound_s"] for t in turns) * 1000
        limits = tiers["disk_read"].get("runs_bytes_per_s", [tiers["disk_read"]["bytes_per_s"]])
        limit = f"{statistics.median(limits) / 1e9:.2f} GB/s"
        if len(limits) > 1:  # combined runs: each run's turns were bound by its own limit
            limit = f"median {limit}{runs_range(limits, 1e-9, '.2f')}"
        rows.append(
            f"| TTFT, history on disk ({met} of {len(turns)} within) | {disk:,.0f} ms | | | "
            f"<= on device + 1.5 x bytes / disk read (median bound {bound:,.0f} ms, disk "
            f"{limit}) | {'yes' if met == len(turns) else 'NO'} |"
        )
    overflow = report.get("overflow") or {}
    if "tieredkv" in overflow and "vllm" in overflow:
        mine, theirs = (overflow[name]["summary"] for name in ("tieredkv", "vllm"))
        met = theirs["ttft_p50_s"] >= 5 * mine["ttft_p50_s"]
        rows.append(
            f"| TTFT p50, chats 3.7x the KV budget (rounds 2-3) | {overflow_ms(mine)} | "
            f"{overflow_ms(theirs)} | {theirs['ttft_p50_s'] / mine['ttft_p50_s']:.1f}x lower | "
            f">= 5x lower than vLLM | {'yes' if met else 'NO'} |"
        )
    return "\n".join(rows)


def overflow_ms(summary: dict) -> str:
    """An overflow p50 in ms; combined runs: the median of the runs' p50s, their range beside."""
    runs = summary.get("runs_ttft_p50_s", [])
    return f"{summary['ttft_p50_s'] * 1000:,.0f} ms{runs_range(runs, 1000, ',.0f')}"


def runs_range(values: list[float], scale: float, spec: str) -> str:
    """The " (min-max)" of several runs' figures, scaled and formatted; "" for one run."""
    if len(values) < 2:
        return ""
    return f" ({min(values) * scale:{spec}}-{max(values) * scale:{spec}})"


def over_runs(figures: list[dict]) -> dict:
    """One figure of several runs: the spread of their medians, and the most cores others took
    during any of their samples."""
    others = [figure.get("others_cores_max") for figure in figures]
    return spread([figure["median"] for figure in figures], others)


def combine(reports: list[dict]) -> dict:
    """Several runs' reports as one: each server figure the median of the runs' medians, with
    the runs' min and max; the tiers turns of every run that has them (each judged by its own
    run's disk limit), and the overflow p50s' median over the runs that have them."""
    combined: dict = {"runs": len(reports)}
    for server in ("tieredkv", "vllm"):
        runs = [r[server] for r in reports if server in r]
        if not runs:
            continue
        merged: dict = {"prefill_tok_per_s": {}, "warm_ttft_s": {}, "decode": {}}
        for section in ("prefill_tok_per_s", "warm_ttft_s"):
            for key in runs[0][section]:
                merged[section][key] = over_runs([run[section][key] for run in runs])
        for key in runs[0]["decode"]:
            merged["decode"][key] = {
                figure: over_runs([run["decode"][key][figure] for run in runs])
                for figure in ("ms_per_token", "tokens_per_s")
            }
        combined[server] = merged
    tiers = [r["tiers"] for r in reports if r.get("tiers")]
    if tiers:
        limits = [t["disk_read"]["bytes_per_s"] for t in tiers]  # each run's turns used its own
        combined["tiers"] = {
            "disk_read": {"bytes_per_s": statistics.median(limits), "runs_bytes_per_s": limits},
            "turns": [turn for t in tiers for turn in t["turns"]],
        }
    overflows = [r["overflow"] for r in reports if r.get("overflow")]
    if overflows:
        combined["overflow"] = {}
        for server in ("tieredkv", "vllm"):
            p50s = [o[server]["summary"]["ttft_p50_s"] for o in overflows if server in o]
            if p50s:
                summary = {"ttft_p50_s": statistics.median(p50s), "runs_ttft_p50_s": p50s}
                combined["overflow"][server] = {"summary": summary}
    return combined


def spread_table(report: dict) -> str:
    """Every figure as median (min-max) for both servers, and the most cores others (other
    processes, the hypervisor's steal) took during any sample behind it (tieredkv's / vLLM's;
    "-" where not measured)."""
    rows = ["| figure | tieredkv | vLLM | others' cores, max |", "|---|---|---|---|"]

    def others(*figures: dict | None) -> str:
        cores = [(figure or {}).get("others_cores_max") for figure in figures]
        return " / ".join("-" if c is None else f"{c:.2f}" for c in cores)

    def cell(value: dict | None, scale: float, spec: str) -> str:
        if value is None:
            return ""
        return (
            f"{value['median'] * scale:{spec}} ({value['min'] * scale:{spec}}-"
            f"{value['max'] * scale:{spec}})"
        )

    ours, peer = report.get("tieredkv", {}), report.get("vllm", {})
    for key in ours.get("prefill_tok_per_s", {}):
        mine, theirs = ours["prefill_tok_per_s"][key], peer.get("prefill_tok_per_s", {}).get(key)
        rows.append(
            f"| cold prefill {key} tokens, tok/s | {cell(mine, 1, ',.0f')} | "
            f"{cell(theirs, 1, ',.0f')} | {others(mine, theirs)} |"
        )
    for key in ours.get("warm_ttft_s", {}):
        mine, theirs = ours["warm_ttft_s"][key], peer.get("warm_ttft_s", {}).get(key)
        rows.append(
            f"| warm turn TTFT, {key}-token history, ms | {cell(mine, 1000, ',.0f')} | "
            f"{cell(theirs, 1000, ',.0f')} | {others(mine, theirs)} |"
        )
    for key in ours.get("decode", {}):
        for figure, scale, spec in (("ms_per_token", 1, ".1f"), ("tokens_per_s", 1, ".1f")):
            mine = ours["decode"][key][figure]
            theirs = peer.get("decode", {}).get(key, {}).get(figure)
            rows.append(
                f"| decode x{key}, {figure.replace('_', ' ')} | {cell(mine, scale, spec)} | "
                f"{cell(theirs, scale, spec)} | {others(mine, theirs)} |"
            )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/vs-vllm"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-gib", type=int, default=2, help="KV budget of each server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--tieredkv-args", default="", help="extra `tieredkv serve` flags")
    parser.add_argument("--tiers", action="store_true", help="also the disk/device decomposition")
    parser.add_argument("--only-tiers", action="store_true", help="only the decomposition")
    parser.add_argument("--overflow", action="store_true", help="also the 3.7x-budget chats")
    parser.add_argument(
        "--combine", nargs="+", type=Path, help="print the tables of these runs' report dirs"
    )
    args = parser.parse_args()
    if args.combine:
        runs = [json.loads((d / "report.json").read_text()) for d in args.combine]
        combined = combine(runs)
        print(targets_table(combined))
        print()
        print(spread_table(combined))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"argv": sys.argv, "repeats": args.repeats, "kv_gib": args.kv_gib}
    servers = ["tieredkv"] if args.skip_vllm else ["vllm", "tieredkv"]
    if args.only_tiers:
        servers = []
    if args.tiers or args.only_tiers:
        print("tieredkv, where a hit's time goes:", flush=True)
        report["tiers"] = measure_tiers(args.out, Prompts(args.seed + 1), args.repeats)
    for name in servers:
        prompts = Prompts(args.seed)  # the same prompts for every server
        print(f"{name}:", flush=True)
        if name == "vllm":
            process, url = start_vllm(args.kv_gib, args.out / "vllm.log")
            try:
                report[name] = asyncio.run(measure(url, prompts, args.repeats, process.pid))
            finally:
                process.terminate()
                process.wait(60)
        else:
            serve_args = ["--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN)]
            serve_args += ["--device-cache-size", f"{args.kv_gib}GiB", "--host-cache-size", "0"]
            serve_args += args.tieredkv_args.split()
            with ManagedServer(serve_args, args.out / "tieredkv.log") as server:
                report[name] = asyncio.run(
                    measure(server.base_url, prompts, args.repeats, server.process.pid)
                )
    if args.overflow:
        report["overflow"] = {}
        if not args.skip_vllm:
            process, url = start_vllm(1, args.out / "vllm-overflow.log")
            try:
                report["overflow"]["vllm"] = overflow_run(url, "vllm", args.seed)
            finally:
                process.terminate()
                process.wait(60)
        serve_args = ["--dtype", "bfloat16", "--max-model-len", "4096"]
        serve_args += ["--device-cache-size", "768MiB", "--host-cache-size", "256MiB"]
        serve_args += ["--disk-cache-dir", str(args.out / "kv-overflow"), "--disk-cache-size"]
        serve_args += ["8GiB", *args.tieredkv_args.split()]
        with ManagedServer(serve_args, args.out / "tieredkv-overflow.log") as server:
            report["overflow"]["tieredkv"] = overflow_run(server.base_url, "tieredkv", args.seed)
        shutil.rmtree(args.out / "kv-overflow")
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    table = targets_table(report) + "\n\n" + spread_table(report)
    (args.out / "targets.md").write_text(table + "\n")
    print(table)
    print(f"report: {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

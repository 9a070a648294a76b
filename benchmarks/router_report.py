"""The router benchmark's summary and its section of docs/benchmarks.md: per configuration
(remote tier on/off x router), TTFT p50/p90 pooled over every request of every rep, and the
prompt tokens the replicas reused (median over reps, with min and max), by tier."""

from __future__ import annotations

import statistics

from tieredkv.bench.records import TIERS, percentiles
from tieredkv.bench.result_file import machine_line

ROUTER_NAMES = {
    "dynamo": "NVIDIA Dynamo KV router (KV events)",
    "cache_aware": "sglang-router cache_aware",
    "round_robin": "sglang-router round_robin",
}


def summarize(records: list[dict]) -> dict:
    """{"configs": one row per (remote, router), in the order they first ran}."""
    groups: dict[tuple[bool, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["remote"], record["router"]), []).append(record)
    return {"configs": [_config_row(remote, router, runs)
                        for (remote, router), runs in groups.items()]}  # fmt: skip


def _config_row(remote: bool, router: str, runs: list[dict]) -> dict:
    rows = [row for run in runs for row in run["requests"]]
    done = [row for row in rows if row["error"] is None and row["ttft_s"] is not None]
    ttft = percentiles([row["ttft_s"] for row in done])
    reused = [sum(run["reused_by_tier"].values()) for run in runs]
    shares = [_share(sum(run["reused_by_tier"].values()), run["prompt_tokens"]) for run in runs]
    return {
        "remote": remote,
        "router": router,
        "reps": len(runs),
        "requests": len(rows),
        "errors": len(rows) - len(done),
        "ttft_p50_s": ttft["p50"],
        "ttft_p90_s": ttft["p90"],
        "reused_tokens": _spread(reused),
        "reused_share": _spread(shares),
        "reused_by_tier": {
            tier: statistics.median(run["reused_by_tier"][tier] for run in runs) for tier in TIERS
        },
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def table(summary: dict) -> str:
    """The summary as a markdown table."""
    rows = [
        "| remote tier | router | TTFT p50 (ms) | TTFT p90 (ms) | prompt tokens reused | "
        "reused share | device / host / disk / remote | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config in summary["configs"]:
        tiers = " / ".join(f"{config['reused_by_tier'][tier]:,.0f}" for tier in TIERS)
        rows.append(
            f"| {'on' if config['remote'] else 'off'} "
            f"| {ROUTER_NAMES.get(config['router'], config['router'])} "
            f"| {_ms(config['ttft_p50_s'])} | {_ms(config['ttft_p90_s'])} "
            f"| {_spread_cell(config['reused_tokens'], '{:,.0f}')} "
            f"| {_spread_cell(config['reused_share'], '{:.1%}')} | {tiers} "
            f"| {config['errors']} of {config['requests']} |"
        )
    return "\n".join(rows)


def _ms(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds * 1000:,.0f}"


def _spread_cell(spread: dict, spec: str) -> str:
    if spread["min"] == spread["max"]:
        return spec.format(spread["median"])
    low, high = spec.format(spread["min"]), spec.format(spread["max"])
    return f"{spec.format(spread['median'])} ({low}-{high})"


def render_markdown(results: list[dict]) -> str:
    """The router section: per result, its setting and the table."""
    parts = [
        "## Routers over replicas\n",
        "`benchmarks/router_compare.py`: tieredkv replicas with small tiers, publishing KV "
        "events, behind NVIDIA Dynamo's KV-aware router (fed by the events), sglang-router's "
        "`cache_aware` policy (which guesses from the text it forwarded) and round robin; a "
        "multi-tenant workload, each tenant with a long system prompt of its own, its requests "
        "arriving at random (Poisson) times; the remote tier (one Redis for all replicas) on and "
        "off. TTFT percentiles pool every request of every rep; prompt tokens reused are the "
        "replicas' `tieredkv_cache_hit_tokens_total` over the workload, median (min-max) over "
        "reps.\n",
    ]
    for result in results:
        s = result["settings"]
        parts.append(
            f"`{result['dir']}` on {machine_line(result)}: {s['replicas']} replicas "
            f"({s['device_cache']} device, {s['host_cache']} host, {s['dtype']}), "
            f"{s['tenants']} tenants of {s['system_words']}-word system prompts, "
            f"{s['requests']} requests at {s['rate']} req/s, {s['max_tokens']} tokens out, "
            f"{s['reps']} rep(s). {_peers_line(result.get('peers') or {})}\n"
        )
        parts.append(table(result["summary"]) + "\n")
    return "\n".join(parts)


def _peers_line(peers: dict) -> str:
    named = ", ".join(f"{name} {version}" for name, version in sorted(peers.items()))
    return f"Routers: {named}." if named else ""

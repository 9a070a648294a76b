"""The issue's target figures, computed from one cached run, the recompute baseline of the same
workload, and the disk bandwidth measured in the same run. Nothing here asserts: each target
says its measured value, its bound, and whether it was met (None when a figure is unknown)."""

from __future__ import annotations

from tieredkv.bench.prefill_cost import PrefillCost
from tieredkv.bench.records import fmt, fmt_times, percentile, ratio

LONG_CONTEXT_TOKENS = 3000
TTFT_SLACK_S = 0.050


def _by_key(records: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["user"], r["round_index"]): r for r in records if not r["error"]}


def disk_requests(records: list[dict], min_prompt_tokens: int) -> list[dict]:
    """Requests whose history came (at least partly) from disk, at long contexts."""
    return [
        r
        for r in records
        if not r["error"]
        and (r["cached_by_tier"].get("disk") or 0) > 0
        and (r["prompt_tokens"] or 0) >= min_prompt_tokens
    ]


def recompute_tok_per_s(baseline: list[dict]) -> float | None:
    """The baseline's prefill speed: median of prompt tokens / TTFT over its requests."""
    speeds = [
        r["prompt_tokens"] / r["ttft_s"]
        for r in baseline
        if not r["error"] and r["prompt_tokens"] and r["ttft_s"]
    ]
    return percentile(speeds, 50)


def evaluate(
    cached: dict,
    baseline: dict | None,
    disk_bytes_per_s: float | None,
    cost: PrefillCost | None = None,
) -> dict:
    """The three disk targets (speed-up, promotion vs bandwidth, TTFT bound) for `cached`.

    The TTFT bound's "suffix prefill time" is the suffix's FLOP share of the same request's
    recompute TTFT when the model's `cost` is known (see prefill_cost), else the suffix's
    length over the baseline's average prefill speed (which undercounts a suffix's attention
    to a long prefix); the latter is reported beside it in every case."""
    slow = disk_requests(cached["records"], LONG_CONTEXT_TOKENS)
    base = _by_key(baseline["records"]) if baseline else {}
    speedups = [
        base[key]["ttft_s"] / r["ttft_s"]
        for r in slow
        if (key := (r["user"], r["round_index"])) in base and r["ttft_s"] and base[key]["ttft_s"]
    ]
    disk = cached["promotion"]["disk"]
    disk_tokens = sum(r["cached_by_tier"]["disk"] for r in disk_requests(cached["records"], 0))
    bytes_per_token = ratio(disk["bytes_moved"], disk_tokens or None)
    ideal_promotion = ratio(disk["bytes_per_promotion"], disk_bytes_per_s)
    promotion_ratio = ratio(disk["p50_s"], ideal_promotion)
    prefill = recompute_tok_per_s(baseline["records"]) if baseline else None
    within, within_avg_rate = [], []
    for r in slow:
        if bytes_per_token is None or disk_bytes_per_s is None or prefill is None:
            break
        cached_tokens = r["cached_tokens"] or 0
        suffix = r["prompt_tokens"] - cached_tokens
        transfer = r["cached_by_tier"]["disk"] * bytes_per_token / disk_bytes_per_s
        within_avg_rate.append(r["ttft_s"] <= transfer + suffix / prefill + TTFT_SLACK_S)
        recompute = base.get((r["user"], r["round_index"]), {}).get("ttft_s")
        if cost is not None and recompute:
            suffix_s = recompute * cost.suffix_share(r["prompt_tokens"], cached_tokens)
            within.append(r["ttft_s"] <= transfer + suffix_s + TTFT_SLACK_S)
    suffix_rule = "FLOP share of the request's recompute TTFT" if within else "average speed"
    if not within:
        within = within_avg_rate
    speedup_p50 = percentile(speedups, 50)
    return {
        "disk_requests_at_3k": len(slow),
        "ttft_speedup_vs_recompute_p50": {
            "value": speedup_p50,
            "target": ">= 10",
            "met": None if speedup_p50 is None else speedup_p50 >= 10,
        },
        "disk_promotion_p50_over_ideal": {
            "value": promotion_ratio,
            "ideal_s": ideal_promotion,
            "target": "<= 1.5 (ideal = bytes per promotion / disk read bandwidth)",
            "met": None if promotion_ratio is None else promotion_ratio <= 1.5,
        },
        "ttft_within_bound": {
            "value": ratio(sum(within), len(within) or None),
            "target": "share of disk requests with TTFT <= bytes/disk_bw + suffix prefill + 50 ms",
            "met": None if not within else all(within),
            "suffix_prefill": suffix_rule,
            "bytes_per_token": bytes_per_token,
            "recompute_tok_per_s": prefill,
        },
        "ttft_within_bound_average_speed": {
            "value": ratio(sum(within_avg_rate), len(within_avg_rate) or None),
            "target": "the same, suffix prefill = suffix tokens / the baseline's tokens/s",
            "met": None if not within_avg_rate else all(within_avg_rate),
        },
    }


def targets_table(targets: dict) -> str:
    """The targets as a Markdown table (unknown values print "unknown")."""
    rows = [
        "| target | measured | bound | met |",
        "| --- | --- | --- | --- |",
    ]
    met = {True: "yes", False: "NO", None: "unknown"}
    speedup = targets["ttft_speedup_vs_recompute_p50"]
    promo = targets["disk_promotion_p50_over_ideal"]
    bound = targets["ttft_within_bound"]
    rows.append(
        f"| TTFT speed-up vs recompute, disk history, >= {LONG_CONTEXT_TOKENS} tokens "
        f"({targets['disk_requests_at_3k']} requests) | {fmt_times(speedup['value'])} "
        f"| >= 10x | {met[speedup['met']]} |"
    )
    rows.append(
        f"| disk promotion p50 / (bytes ÷ disk bandwidth) | {fmt(promo['value'], '.2f')} "
        f"(ideal {fmt(promo['ideal_s'], '.1f', 1000)} ms) | <= 1.5 | {met[promo['met']]} |"
    )
    rows.append(
        f"| TTFT <= bytes/disk bw + suffix prefill + 50 ms (suffix prefill: "
        f"{bound.get('suffix_prefill', 'average speed')}) | {fmt(bound['value'], '.0%')} of "
        f"requests | all | {met[bound['met']]} |"
    )
    average = targets.get("ttft_within_bound_average_speed")
    if average is not None and bound.get("suffix_prefill") != "average speed":
        rows.append(
            f"| the same, suffix prefill = suffix / baseline tokens/s | "
            f"{fmt(average['value'], '.0%')} of requests | all | {met[average['met']]} |"
        )
    return "\n".join(rows)

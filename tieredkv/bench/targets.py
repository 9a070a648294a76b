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


# the TTFT bound's "suffix prefill time": the suffix's FLOP share of the same request's
# recompute TTFT, the suffix's length over the recompute baseline's average speed, and as the
# server itself measured it (first forward to first token). Only the first two judge: the
# server's own figure is the code under test grading itself, reported as a diagnostic.
BOUND_RULES = {
    "flop_share": "FLOP share of the request's recompute TTFT",
    "average_speed": "suffix tokens / the recompute baseline's tokens/s",
    "server": "measured by the server (first forward to first token; a diagnostic, not a judge)",
}
JUDGING_RULES = ("flop_share", "average_speed")


def _suffix_prefill_s(
    rule: str, r: dict, recompute_s: float | None, prefill: float | None, cost: PrefillCost | None
) -> float | None:
    cached_tokens = r["cached_tokens"] or 0
    if rule == "server":
        queue, ttft = r.get("server_queue_s"), r.get("server_ttft_s")
        return None if queue is None or ttft is None else ttft - queue
    if rule == "flop_share":
        if cost is None or not recompute_s:
            return None
        return recompute_s * cost.suffix_share(r["prompt_tokens"], cached_tokens)
    return None if prefill is None else (r["prompt_tokens"] - cached_tokens) / prefill


def bound_rules(
    slow: list[dict],
    base: dict[tuple[int, int], dict],
    bytes_per_token: float | None,
    disk_bytes_per_s: float | None,
    prefill: float | None,
    cost: PrefillCost | None,
) -> dict[str, dict]:
    """Per rule with a value for every request: the share of requests within
    bytes / disk bandwidth + suffix prefill + 50 ms, and each request's margin (bound - TTFT)."""
    results = {}
    if bytes_per_token is None or disk_bytes_per_s is None or not slow:
        return results
    for rule, text in BOUND_RULES.items():
        margins = []
        for r in slow:
            recompute = base.get((r["user"], r["round_index"]), {}).get("ttft_s")
            suffix_s = _suffix_prefill_s(rule, r, recompute, prefill, cost)
            if suffix_s is None or not r["ttft_s"]:
                break
            transfer = r["cached_by_tier"]["disk"] * bytes_per_token / disk_bytes_per_s
            margins.append(transfer + suffix_s + TTFT_SLACK_S - r["ttft_s"])
        else:
            within = sum(m >= 0 for m in margins)
            results[rule] = {
                "suffix_prefill": text,
                "value": within / len(margins),
                "met": within == len(margins),
                "margin_p50_s": percentile(margins, 50),
                "margin_min_s": min(margins),
            }
    return results


def evaluate(
    cached: dict,
    baseline: dict | None,
    disk_bytes_per_s: float | None,
    cost: PrefillCost | None = None,
) -> dict:
    """The three disk targets (speed-up, promotion vs bandwidth, TTFT bound) for `cached`.

    The TTFT bound is judged by the first of JUDGING_RULES that has a value for every request;
    every rule with values is reported, the server's own measurement as a diagnostic."""
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
    rules = bound_rules(slow, base, bytes_per_token, disk_bytes_per_s, prefill, cost)
    headline = next((rules[rule] for rule in JUDGING_RULES if rule in rules), None)
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
            "value": None if headline is None else headline["value"],
            "target": "share of disk requests with TTFT <= bytes/disk_bw + suffix prefill + 50 ms",
            "met": None if headline is None else headline["met"],
            "suffix_prefill": None if headline is None else headline["suffix_prefill"],
            "bytes_per_token": bytes_per_token,
            "recompute_tok_per_s": prefill,
        },
        "ttft_within_bound_rules": rules,
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
    rows.append(
        f"| TTFT speed-up vs recompute, disk history, >= {LONG_CONTEXT_TOKENS} tokens "
        f"({targets['disk_requests_at_3k']} requests) | {fmt_times(speedup['value'])} "
        f"| >= 10x | {met[speedup['met']]} |"
    )
    rows.append(
        f"| disk promotion p50 / (bytes ÷ disk bandwidth) | {fmt(promo['value'], '.2f')} "
        f"(ideal {fmt(promo['ideal_s'], '.1f', 1000)} ms) | <= 1.5 | {met[promo['met']]} |"
    )
    for rule in targets.get("ttft_within_bound_rules", {}).values():
        rows.append(
            f"| TTFT <= bytes/disk bw + suffix prefill + 50 ms; suffix prefill "
            f"{rule['suffix_prefill']} (margin p50 {fmt(rule['margin_p50_s'], '.0f', 1000)} ms, "
            f"min {fmt(rule['margin_min_s'], '.0f', 1000)} ms) | {fmt(rule['value'], '.0%')} of "
            f"requests | all | {met[rule['met']]} |"
        )
    if not targets.get("ttft_within_bound_rules"):
        rows.append("| TTFT <= bytes/disk bw + suffix prefill + 50 ms | unknown | all | unknown |")
    return "\n".join(rows)

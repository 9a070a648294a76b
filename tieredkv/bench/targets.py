"""The target figures of a multi-turn run, judged by what the client knows: the turns it sent,
the recompute baseline of the same workload, the model's KV bytes per token, and the disk limit
probed in the same run. Nothing here asserts: each target says its measured value, its bound,
and whether it was met (None when a figure is unknown).

A reuse turn can reuse its conversation's history: the previous turn's prompt and answer, in
whole pages. Its bound counts that whole history as read from disk, so it holds for a turn
served from any tier. What the server reports (tokens per tier, its promotion histogram) is
cross-checked and printed, never used as an allowance."""

from __future__ import annotations

from tieredkv.bench.prefill_cost import PrefillCost
from tieredkv.bench.records import fmt, fmt_times, percentile, ratio

LONG_CONTEXT_TOKENS = 3000
TTFT_SLACK_S = 0.050
SPEEDUP_TARGET = 10.0

# the bound's "suffix prefill time": the suffix's FLOP share of the same request's recompute
# TTFT, or the suffix's length over the recompute baseline's average speed; the first rule with
# a value for every turn judges
BOUND_RULES = {
    "flop_share": "FLOP share of the request's recompute TTFT",
    "average_speed": "suffix tokens / the recompute baseline's tokens/s",
}


def _by_key(records: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["user"], r["round_index"]): r for r in records if not r["error"]}


def history_tokens(records: list[dict], page_size: int) -> dict[tuple[int, int], int]:
    """Per reuse turn: the tokens of its history (previous prompt + answer), whole pages."""
    done = _by_key(records)
    history = {}
    for (user, round_index), r in done.items():
        previous = done.get((user, round_index - 1))
        if previous and previous["prompt_tokens"] and previous["output_tokens"] is not None:
            tokens = previous["prompt_tokens"] + previous["output_tokens"]
            tokens = min(tokens, r["prompt_tokens"] or 0)
            history[(user, round_index)] = tokens // page_size * page_size
    return history


def recompute_tok_per_s(baseline: list[dict]) -> float | None:
    """The baseline's prefill speed: median of prompt tokens / TTFT over its requests."""
    speeds = [
        r["prompt_tokens"] / r["ttft_s"]
        for r in baseline
        if not r["error"] and r["prompt_tokens"] and r["ttft_s"]
    ]
    return percentile(speeds, 50)


def bound_rules(
    turns: list[tuple[dict, int]],
    base: dict[tuple[int, int], dict],
    disk_bytes_per_s: float | None,
    prefill: float | None,
    cost: PrefillCost | None,
) -> dict[str, dict]:
    """Per rule with a value for every turn: the share of `turns` (record, history tokens)
    within history bytes / disk limit + suffix prefill + 50 ms, and the margins (bound - TTFT)."""
    results = {}
    if cost is None or not disk_bytes_per_s or not turns:
        return results
    for rule, text in BOUND_RULES.items():
        margins = []
        for r, history in turns:
            suffix = r["prompt_tokens"] - history
            recompute = base.get((r["user"], r["round_index"]), {}).get("ttft_s")
            if rule == "flop_share":
                share = cost.suffix_share(r["prompt_tokens"], history)
                suffix_s = recompute * share if recompute else None
            else:
                suffix_s = suffix / prefill if prefill else None
            if suffix_s is None or not r["ttft_s"]:
                break
            transfer = cost.history_bytes(history) / disk_bytes_per_s
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


def server_check(turns: list[tuple[dict, int]]) -> dict:
    """What the server says of the judged turns: how many it served partly from disk, and the
    turns where it claims more cached tokens than their history holds (a disagreement)."""
    over = [
        [r["user"], r["round_index"]] for r, history in turns if (r["cached_tokens"] or 0) > history
    ]
    from_disk = sum(1 for r, _ in turns if (r["cached_by_tier"].get("disk") or 0) > 0)
    return {"turns_from_disk": from_disk, "cached_over_history": over}


def promotion_diagnostic(cached: dict, disk_bytes_per_s: float | None) -> dict:
    """The server-reported disk promotion p50 (its own histogram) over bytes / disk limit."""
    disk = (cached.get("promotion") or {}).get("disk") or {}
    ideal = ratio(disk.get("bytes_per_promotion"), disk_bytes_per_s)
    return {"value": ratio(disk.get("p50_s"), ideal), "ideal_s": ideal}


def evaluate(
    cached: dict,
    baseline: dict | None,
    disk_bytes_per_s: float | None,
    cost: PrefillCost | None = None,
) -> dict:
    """The targets for `cached`: TTFT speed-up and TTFT bound over the long reuse turns."""
    page_size = cost.page_size if cost else 1
    history = history_tokens(cached["records"], page_size)
    turns = [
        (r, history[key])
        for r in cached["records"]
        if (key := (r["user"], r["round_index"])) in history
        and not r["error"]
        and (r["prompt_tokens"] or 0) >= LONG_CONTEXT_TOKENS
    ]
    base = _by_key(baseline["records"]) if baseline else {}
    speedups = [
        base[key]["ttft_s"] / r["ttft_s"]
        for r, _ in turns
        if (key := (r["user"], r["round_index"])) in base and r["ttft_s"] and base[key]["ttft_s"]
    ]
    prefill = recompute_tok_per_s(baseline["records"]) if baseline else None
    rules = bound_rules(turns, base, disk_bytes_per_s, prefill, cost)
    headline = next(iter(rules.values()), None)
    speedup_p50 = percentile(speedups, 50)
    return {
        "long_reuse_turns": len(turns),
        "ttft_speedup_vs_recompute_p50": {
            "value": speedup_p50,
            "target": f">= {SPEEDUP_TARGET:g}",
            "met": None if speedup_p50 is None else speedup_p50 >= SPEEDUP_TARGET,
        },
        "ttft_within_bound": {
            "value": None if headline is None else headline["value"],
            "target": "share of turns with TTFT <= history bytes/disk limit + suffix prefill "
            "+ 50 ms",
            "met": None if headline is None else headline["met"],
            "suffix_prefill": None if headline is None else headline["suffix_prefill"],
            "kv_bytes_per_page": cost.page_bytes if cost else None,
            "recompute_tok_per_s": prefill,
        },
        "ttft_within_bound_rules": rules,
        "server_check": server_check(turns),
        "server_promotion_p50_over_ideal": promotion_diagnostic(cached, disk_bytes_per_s),
    }


def targets_table(targets: dict) -> str:
    """The targets as a Markdown table (unknown values print "unknown"), then the server's
    own figures as diagnostics."""
    met = {True: "yes", False: "NO", None: "unknown"}
    speedup = targets["ttft_speedup_vs_recompute_p50"]
    bound = "TTFT <= history bytes/disk limit + suffix prefill + 50 ms"
    rows = [
        "| target | measured | bound | met |",
        "| --- | --- | --- | --- |",
        f"| TTFT speed-up vs recompute, reuse turns >= {LONG_CONTEXT_TOKENS} tokens "
        f"({targets['long_reuse_turns']} turns) | {fmt_times(speedup['value'])} "
        f"| >= {SPEEDUP_TARGET:g}x | {met[speedup['met']]} |",
    ]
    for rule in targets["ttft_within_bound_rules"].values():
        rows.append(
            f"| {bound}; suffix prefill {rule['suffix_prefill']} (margin p50 "
            f"{fmt(rule['margin_p50_s'], '.0f', 1000)} ms, min "
            f"{fmt(rule['margin_min_s'], '.0f', 1000)} ms) | {fmt(rule['value'], '.0%')} of "
            f"turns | all | {met[rule['met']]} |"
        )
    if not targets["ttft_within_bound_rules"]:
        rows.append(f"| {bound} | unknown | all | unknown |")
    check, promo = targets["server_check"], targets["server_promotion_p50_over_ideal"]
    over = check["cached_over_history"]
    rows += [
        "",
        f"Server-reported (diagnostics, not targets): {check['turns_from_disk']} of the turns "
        f"partly from disk; disk promotion p50 / (bytes ÷ disk limit) "
        f"{fmt(promo['value'], '.2f')} (ideal {fmt(promo['ideal_s'], '.1f', 1000)} ms)"
        + (f"; DISAGREES: cached tokens over the history on turns {over}" if over else ""),
    ]
    return "\n".join(rows)

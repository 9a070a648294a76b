"""What benchmarks/replicas.py reports beside the usual tables: per configuration, the
reuse rounds, the restart round and the restart itself, and the turns classified by where their
history came from (usage's `cached_tokens_by_tier`): a turn whose history came mostly from the
remote tier landed on a replica that never saw (that part of) its conversation; one mostly from
local disk is the local hit it is compared with; the recompute baseline's TTFT of the same
turns (same user, same round) is the other side. "Mostly": a tier served more than half of the
turn's prompt tokens. The targets are judged on the medians."""

from __future__ import annotations

from collections.abc import Callable

from tieredkv.bench.records import TIERS, fmt, fmt_spread, fmt_times, percentile, ratio, spread
from tieredkv.bench.tables import HIT_COLUMNS, markdown_table

RECOMPUTE_OVER_REMOTE_MIN = 10.0  # a remote hit's TTFT at least 10x lower than recomputing
REMOTE_OVER_DISK_MAX = 2.0  # and within 2x of a local disk hit
LOST_BELOW_HIT = 0.5  # a turn after the restart reusing less: its history was found nowhere
CLASSES = ("remote", "disk")


def dominant_tier(record: dict) -> str | None:
    """The tier that served more than half of the turn's prompt tokens; None when none did,
    or the turn failed or its usage is unknown."""
    prompt = record["prompt_tokens"]
    if record["error"] or not prompt:
        return None
    for tier in TIERS:
        tokens = record["cached_by_tier"].get(tier)
        if tokens is not None and 2 * tokens > prompt:
            return tier
    return None


def classified(records: list[dict]) -> dict[str, list[dict]]:
    """The timed turns of each class in CLASSES."""
    out: dict[str, list[dict]] = {name: [] for name in CLASSES}
    for record in records:
        tier = dominant_tier(record)
        if tier in out and record["ttft_s"] is not None:
            out[tier].append(record)
    return out


def first_turns_after(records: list[dict], restart_turn: list[int] | tuple[int, int]) -> list[dict]:
    """Each conversation's first turn after the restart: the restart round's from the restart
    user on, the next round's for the users before."""
    round_index, first_user = restart_turn
    return [
        r
        for r in records
        if r["round_index"] == (round_index if r["user"] >= first_user else round_index + 1)
    ]


def lost_users(records: list[dict], restart_turn: list[int] | tuple[int, int] | None) -> list[int]:
    """Users whose first turn after the restart failed or reused under LOST_BELOW_HIT of its
    prompt (nothing held their history: not the replica it landed on, not Redis)."""
    if restart_turn is None:
        return []
    lost = []
    for r in first_turns_after(records, restart_turn):
        hit = ratio(r["cached_tokens"], r["prompt_tokens"])
        if r["error"] or hit is None or hit < LOST_BELOW_HIT:
            lost.append(r["user"])
    return sorted(lost)


def tier_figures(records: list[dict], baseline: dict | None) -> dict:
    """TTFT spreads of the remote-hit and disk-hit turns, the baseline's over the remote-hit
    turns, and the two target ratios (p50 over p50) with whether each is met."""
    turns = classified(records)
    base = {(r["user"], r["round_index"]): r for r in (baseline or {}).get("records", [])}
    same = [base.get((r["user"], r["round_index"])) for r in turns["remote"]]
    recompute = [b["ttft_s"] for b in same if b and not b["error"] and b["ttft_s"] is not None]
    out = {f"{name}_hits": spread([r["ttft_s"] for r in turns[name]]) for name in CLASSES}
    out["recompute_same_turns"] = spread(recompute)
    out["remote_prompt_tokens_p50"] = percentile([r["prompt_tokens"] for r in turns["remote"]], 50)
    over_remote = ratio(out["recompute_same_turns"]["median"], out["remote_hits"]["median"])
    over_disk = ratio(out["remote_hits"]["median"], out["disk_hits"]["median"])
    out["recompute_over_remote"] = _judged(over_remote, lambda v: v >= RECOMPUTE_OVER_REMOTE_MIN)
    out["remote_over_disk"] = _judged(over_disk, lambda v: v <= REMOTE_OVER_DISK_MAX)
    return out


def _judged(value: float | None, rule: Callable[[float], bool]) -> dict:
    return {"value": value, "met": None if value is None else rule(value)}


def analyze(runs: list[dict], baseline: dict | None) -> dict:
    """The replicas section of the report: one entry per configuration, and every
    configuration's turns pooled."""
    configurations = []
    for run in runs:
        info = run["replicas"]
        by_round = run["summary"]["by_round"]
        restart_turn = info["restart_turn"]
        restart_round = by_round[restart_turn[0]] if restart_turn else None
        lost = lost_users(run["records"], restart_turn)
        configurations.append({
            "label": run["label"],
            "remote_tier": info["remote"],
            "router_policy": info["router_policy"],
            "restart_s": [r["seconds"] for r in info["restarts"]],
            "restart_round_ttft_p50_s": restart_round["ttft_s"]["p50"] if restart_round else None,
            "lost_after_restart": lost,
            "no_conversation_lost": None if restart_turn is None else not lost,
            "remote_promotion": run.get("remote_promotion"),
            "redis_get": run.get("redis_get"),
            **tier_figures(run["records"], baseline),
        })  # fmt: skip
    pooled = tier_figures([r for run in runs for r in run["records"]], baseline)
    return {"configurations": configurations, "pooled": pooled}


def _ms(figures: dict) -> str:
    """The median and range in ms, and the count: "230 (208-327), n=4"."""
    if not figures["n"]:
        return "none"
    return f"{fmt_spread(figures, '.0f', 1000)}, n={figures['n']}"


def _verdict(judged: dict) -> str:
    met = {True: "met", False: "missed", None: "unknown"}[judged["met"]]
    return f"{fmt_times(judged['value'])} {met}" if judged["value"] is not None else met


def _lost_cell(entry: dict) -> str:
    if entry["no_conversation_lost"] is None:
        return "n/a"
    lost = entry["lost_after_restart"]
    return f"users {', '.join(map(str, lost))}" if lost else "none"


def _restart_verdict(with_remote: list[dict]) -> str:
    verdicts = [entry["no_conversation_lost"] for entry in with_remote]
    if not verdicts:
        return "n/a (no configuration with it)"
    if None in verdicts:
        return "unknown (no restart)"
    return "met" if all(verdicts) else "missed"


def restart_table(runs: list[dict], analysis: dict) -> str:
    """Per configuration: the reuse rounds, the restart round, the restart and its losses."""
    header = ["configuration", "reuse TTFT p50 ms", "p90 ms", "restart round p50 ms", "hit",
              *HIT_COLUMNS, "errors", "restart s", "lost in restart"]  # fmt: skip
    rows = []
    for run, entry in zip(runs, analysis["configurations"], strict=True):
        reuse = run["summary"]["reuse_rounds"] or run["summary"]["overall"]
        rows.append([
            entry["label"],
            *(fmt(reuse["ttft_s"][q], ".0f", 1000) for q in ("p50", "p90")),
            fmt(entry["restart_round_ttft_p50_s"], ".0f", 1000),
            fmt(reuse["hit_ratio"], ".1%"),
            *(fmt(reuse["hit_ratio_by_tier"][t], ".1%") for t in TIERS),
            str(run["summary"]["overall"]["errors"]),
            ", ".join(f"{s:.1f}" for s in entry["restart_s"]) or "no restart",
            _lost_cell(entry),
        ])  # fmt: skip
    return markdown_table(header, rows)


def tier_table(analysis: dict) -> str:
    """Per configuration and pooled: remote-hit, disk-hit and recompute TTFT, and the ratios."""
    header = ["configuration", "history mostly from Redis: TTFT median ms (min-max), n",
              "mostly from local disk", "recompute, the Redis turns", "their prompt tok p50",
              f"recompute ÷ Redis (>= {RECOMPUTE_OVER_REMOTE_MIN:.0f}x)",
              f"Redis ÷ disk (<= {REMOTE_OVER_DISK_MAX:.0f}x)"]  # fmt: skip
    entries = [*analysis["configurations"], {"label": "all configurations", **analysis["pooled"]}]
    rows = [
        [e["label"], _ms(e["remote_hits"]), _ms(e["disk_hits"]), _ms(e["recompute_same_turns"]),
         fmt(e["remote_prompt_tokens_p50"], ".0f"), _verdict(e["recompute_over_remote"]),
         _verdict(e["remote_over_disk"])]
        for e in entries
    ]  # fmt: skip
    return markdown_table(header, rows)


def bandwidth_table(analysis: dict) -> str:
    """Per configuration with the remote tier: its promotion bandwidth (the replicas' own
    counters) beside Redis's pipelined GET throughput measured after the turns, same run."""
    header = ["configuration", "promotions from Redis", "MB moved", "promotion GB/s",
              "Redis GET GB/s (limit)", "redis-py / redis-benchmark GB/s", "GETs a round trip",
              "of the limit"]  # fmt: skip
    rows = []
    for entry in analysis["configurations"]:
        promotion, limit = entry.get("remote_promotion"), entry.get("redis_get")
        if promotion is None or limit is None:
            continue
        share = ratio(promotion["gbps"], limit["gbps"])
        clients = [fmt(limit.get(k), ".2f") for k in ("redis_py_gbps", "redis_benchmark_gbps")]
        rows.append([
            entry["label"], fmt(promotion["promotions"], ".0f"),
            fmt(promotion["bytes"], ".1f", 1e-6), fmt(promotion["gbps"], ".2f"),
            fmt(limit["gbps"], ".2f"),
            " / ".join(clients),
            str(limit["batch"]), fmt(share, ".0%"),
        ])  # fmt: skip
    return markdown_table(header, rows)


def replicas_tables(runs: list[dict], analysis: dict) -> str:
    """The two tables of the replicas run, and a line on the restart target."""
    restart = _restart_verdict([e for e in analysis["configurations"] if e["remote_tier"]])
    return "\n\n".join([
        restart_table(runs, analysis),
        "A turn on a replica that never saw its conversation (its history mostly from Redis) "
        "against a local disk hit and against recomputing the same turns:",
        tier_table(analysis),
        f"The restart loses no conversation with the remote tier on: {restart}.",
        "The remote tier's promotion bandwidth (bytes from Redis over the seconds promotions "
        "from it took, every replica's counters) beside Redis's own pipelined GET throughput "
        "on the values they wrote (loopback, one client, measured after the turns):",
        bandwidth_table(analysis),
    ])  # fmt: skip

"""benchmarks/radix_vs_sglang.py's records, figures and docs section.

A record is one system's samples in one run: `{"run", "system", "samples_ns": {op: [ns, ...]}}`,
plus, for the two trees, `prompt_tokens`, `hit_tokens` and `evicted_pages`. `system` is
"tieredkv", "sglang" or "limit" (the memcmp floor, under op "match"). Every figure is computed
from the records: per run a p50 (a p99 where the run has 100+ samples), then across runs the
median with min and max. SGLang appears only where its records are present, that is where it
was measured in the same run.
"""

from __future__ import annotations

import statistics
from typing import Any

from tieredkv.bench.result_file import machine_line

from .replay_trace import OPS

SYSTEMS = ("tieredkv", "sglang")
LIMIT = "limit"
MIN_P99_SAMPLES = 100
Spread = dict[str, float]  # median, min, max across runs


def run_record(run: int, system: str, replay: Any, prompt_tokens: int) -> dict[str, Any]:
    """One tree's samples and counters after replaying the trace once."""
    return {
        "run": run,
        "system": system,
        "prompt_tokens": prompt_tokens,
        "hit_tokens": replay.hit_tokens,
        "evicted_pages": replay.evicted_pages,
        "samples_ns": {op: list(replay.samples[op]) for op in OPS},
    }


def _p50_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def _p99_us(samples: list[int]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] / 1e3


def _spread(values: list[float]) -> Spread | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _op_figures(runs: list[list[int]]) -> dict[str, Any]:
    """p50 and p99 across runs of one op's per-run samples (p99 only if every run has 100+)."""
    timed = [samples for samples in runs if samples]
    enough = bool(timed) and all(len(samples) >= MIN_P99_SAMPLES for samples in timed)
    return {
        "calls": statistics.median(len(samples) for samples in runs),
        "p50_us": _spread([_p50_us(samples) for samples in timed]),
        "p99_us": _spread([_p99_us(samples) for samples in timed]) if enough else None,
    }


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of every system present in `records`."""
    summary: dict[str, Any] = {}
    for system in (*SYSTEMS, LIMIT):
        mine = sorted((r for r in records if r["system"] == system), key=lambda r: r["run"])
        if not mine:
            continue
        ops = [op for op in OPS if op in mine[0]["samples_ns"]]
        figures = {op: _op_figures([r["samples_ns"][op] for r in mine]) for op in ops}
        if system in SYSTEMS:
            evict_us = [sum(r["samples_ns"]["evict"]) / 1e3 for r in mine]
            figures["hit_pct"] = _spread([100 * r["hit_tokens"] / r["prompt_tokens"] for r in mine])
            figures["evicted_pages"] = statistics.median(r["evicted_pages"] for r in mine)
            figures["evict_us_per_page"] = _spread(
                [us / max(r["evicted_pages"], 1) for us, r in zip(evict_us, mine, strict=True)]
            )
        summary[system] = figures
    return summary


def _fmt(spread: Spread | None, digits: int = 1) -> str:
    if spread is None:
        return "—"
    return f"{spread['median']:.{digits}f} ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})"


def _table(summary: dict[str, Any], sglang_name: str) -> list[str]:
    systems = [s for s in SYSTEMS if s in summary]
    names = {"tieredkv": "tieredkv", "sglang": sglang_name}
    head = ["call"]
    for system in systems:
        head += [f"{names[system]} p50 µs", f"{names[system]} p99 µs"]
    head += ["limit µs (same run)", "calls per run (" + " / ".join(names[s] for s in systems) + ")"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    limit = summary.get(LIMIT, {})
    for op in OPS:
        row = [op]
        for system in systems:
            row += [_fmt(summary[system][op]["p50_us"]), _fmt(summary[system][op]["p99_us"], 0)]
        row.append(_fmt(limit[op]["p50_us"], 2) if op in limit else "—")
        row.append(" / ".join(f"{summary[s][op]['calls']:g}" for s in systems))
        lines.append("| " + " | ".join(row) + " |")
    row = ["evict, per evicted page"]
    for system in systems:
        row += [_fmt(summary[system]["evict_us_per_page"], 2), "—"]
    pages = " / ".join(f"{summary[s]['evicted_pages']:g} pages" for s in systems)
    lines.append("| " + " | ".join([*row, "—", pages]) + " |")
    return lines


def _section(result: dict[str, Any]) -> list[str]:
    settings = result["settings"]
    summary = summarise(result["records"])
    sglang = result["peers"].get("sglang")
    sglang_name = f"SGLang {sglang['version']}" if sglang else "SGLang"
    if sglang and "sglang" in summary:
        peer = f"{sglang_name} (`RadixCache`, LRU, on CPU) measured in the same runs."
    else:
        peer = "SGLang: not measured in this run."
    hits = ", ".join(
        f"{'tieredkv' if s == 'tieredkv' else sglang_name} {_fmt(summary[s]['hit_pct'])} %"
        for s in SYSTEMS
        if s in summary
    )
    return [
        f"### `{result['dir']}`",
        "",
        f"{result['date']}, `{' '.join(result['command'])}`, on {machine_line(result)}. {peer}",
        f"Trace: {settings['users']} users x {settings['rounds']} rounds, prompts "
        f"{settings['prompt_len_min']}-{settings['prompt_len_max']} tokens, page size "
        f"{settings['page_size']}, {settings['device_pages']} device pages, "
        f"{settings['runs']} runs; the limit is one memcmp of a {settings['limit_prompt_len']}"
        "-token prompt's packed bytes with a stored copy.",
        "",
        *_table(summary, sglang_name),
        "",
        f"Prompt tokens found in the tree: {hits}.",
        "",
    ]


def render_markdown(results: list[dict[str, Any]]) -> str:
    """The docs section of every radix_vs_sglang result, oldest first."""
    lines = [
        "## Radix tree against SGLang's RadixCache",
        "",
        "`benchmarks/radix_vs_sglang.py` replays one seeded multi-turn chat trace through "
        "tieredkv's tree (driven by the engine's `RequestPages`) and, when installed "
        "(`benchmarks/sglang_radix.sh install`), through SGLang's `RadixCache` over its paged "
        "allocator, request by request in the same process, most requests evicting. Each figure "
        "is the median over runs of each run's p50 (p99) per call in µs, with (min-max); a p99 "
        "only where every run has 100+ calls. SGLang evicts whole leaves (often more than asked) "
        "where tieredkv evicts exactly the shortfall, so eviction is also shown per evicted page.",
        "",
    ]
    for result in results:
        lines += _section(result)
    return "\n".join(lines)

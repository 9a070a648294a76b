"""The targets table of several runs of `benchmarks/vs_vllm.py`, and how runs combine.

Each figure is the median of the runs' medians with their (min-max); a single run shows its
own median with the (min-max) of its samples. A target is judged on the combined medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

SERVERS = ("tieredkv", "vllm")
GIB = 2**30


def combined(spreads: list[dict]) -> dict | None:
    """One figure over runs: the median of the runs' medians with their min and max; one run's
    figure as it is (its samples' median, min, max)."""
    spreads = [s for s in spreads if s is not None]
    if not spreads:
        return None
    if len(spreads) == 1:
        return spreads[0]
    medians = [s["median"] for s in spreads]
    return {"median": statistics.median(medians), "min": min(medians), "max": max(medians)}


def values_spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(figure: dict | None, scale: float = 1.0, spec: str = ",.0f", unit: str = "") -> str:
    """`median (min-max) unit`; the range left out when it is one value."""
    if figure is None:
        return "-"
    low, mid, high = (figure[k] * scale for k in ("min", "median", "max"))
    text = f"{mid:{spec}}"
    if f"{low:{spec}}" != f"{high:{spec}}":
        text += f" ({low:{spec}}-{high:{spec}})"
    return f"{text} {unit}".rstrip()


def numeric_keys(section: dict) -> list[str]:
    return sorted(section, key=lambda key: float(key))


def raw(results: list[dict], server: str, *path: str) -> list[dict | None]:
    """Each run's summary figure at `path` (None where a run lacks it)."""
    spreads = []
    for result in results:
        node = result["summary"].get(server)
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        spreads.append(node)
    return spreads


def figure(results: list[dict], server: str, *path: str) -> dict | None:
    """A summary figure of every run that has it, combined."""
    return combined(raw(results, server, *path))


def others(*figures_by_server: list[dict | None]) -> str:
    """The most cores others took during any sample, per server ("-": not measured)."""
    cells = []
    for spreads in figures_by_server:
        known = [s["others_cores_max"] for s in spreads if s and "others_cores_max" in s]
        cells.append(f"{max(known):.2f}" if known else "-")
    return " / ".join(cells)


class Rows:
    """The targets table: one row per figure, both servers, the ratio and the rule."""

    def __init__(self, results: list[dict]) -> None:
        self.results = results
        self.lines = [
            "| figure | tieredkv | vLLM | ratio | rule | met | others' cores, max |",
            "|---|---|---|---|---|---|---|",
        ]

    def pair(
        self,
        name: str,
        path: tuple[str, ...],
        scale: float,
        spec: str,
        unit: str,
        rule: str,
        met: Callable[[float, float], bool],
    ) -> None:
        mine, theirs = (figure(self.results, server, *path) for server in SERVERS)
        if mine is None:
            return
        load = others(*(raw(self.results, server, *path) for server in SERVERS))
        if theirs is None:
            self.lines.append(
                f"| {name} | {cell(mine, scale, spec, unit)} | - | | {rule} | | {load} |"
            )
            return
        ratio = mine["median"] / theirs["median"]
        verdict = "yes" if met(mine["median"], theirs["median"]) else "NO"
        self.lines.append(
            f"| {name} | {cell(mine, scale, spec, unit)} | {cell(theirs, scale, spec, unit)} | "
            f"{ratio:.2f}x | {rule} | {verdict} | {load} |"
        )


def first_summary(results: list[dict], server: str) -> dict:
    for result in results:
        if result["summary"].get(server):
            return result["summary"][server]
    return {}


def targets_table(
    results: list[dict], tiers: list[dict] | None = None, overflow: list[dict] | None = None
) -> list[str]:
    """The figures of `results` against their limits; the disk rule's and the overflow's rows
    from `tiers` and `overflow` (by default `results` too)."""
    rows = Rows(results)
    ours = first_summary(results, "tieredkv")
    for length in numeric_keys(ours.get("prefill_tok_per_s", {})):
        rows.pair(
            f"cold prefill, {length} tokens",
            ("prefill_tok_per_s", length),
            1,
            ",.0f",
            "tok/s",
            ">= 0.8x vLLM",
            lambda a, b: a >= 0.8 * b,
        )
    for length in numeric_keys(ours.get("warm_ttft_s", {})):
        rows.pair(
            f"warm turn TTFT, {length}-token history",
            ("warm_ttft_s", length),
            1000,
            ",.0f",
            "ms",
            "<= 1.0x vLLM",
            lambda a, b: a <= b,
        )
    for streams in numeric_keys(ours.get("decode", {})):
        rows.pair(
            f"decode x{streams}, ms/token",
            ("decode", streams, "ms_per_token"),
            1,
            ".1f",
            "ms",
            "<= 0.8x vLLM",
            lambda a, b: a <= 0.8 * b,
        )
        rows.pair(
            f"decode x{streams}, throughput",
            ("decode", streams, "tokens_per_s"),
            1,
            ",.1f",
            "tok/s",
            ">= vLLM",
            lambda a, b: a >= b,
        )
    rows.lines += tiers_rows(results if tiers is None else tiers)
    rows.lines += overflow_target(results if overflow is None else overflow)
    return rows.lines if len(rows.lines) > 2 else []


def tiers_rows(results: list[dict]) -> list[str]:
    """The disk rule over every run's turns, each judged by its own run's disk limit."""
    tiers = [r["summary"]["tiers"] for r in results if r["summary"].get("tiers")]
    if not tiers:
        return []
    turns = [turn for t in tiers for turn in t["turns"]]
    met = sum(turn["met"] for turn in turns)
    disk = values_spread([turn["disk_ttft_s"] for turn in turns])
    bound = statistics.median(turn["bound_s"] for turn in turns)
    limit = values_spread([t["disk_read"]["bytes_per_s"] for t in tiers])
    return [
        f"| TTFT, 3k-token history on disk ({met} of {len(turns)} turns within) | "
        f"{cell(disk, 1000, ',.0f', 'ms')} | | | <= on device + 1.5 x history bytes / disk read "
        f"(median bound {bound * 1000:,.0f} ms; disk {cell(limit, 1e-9, '.2f', 'GB/s')}) | "
        f"{'yes' if met == len(turns) else 'NO'} | |"
    ]


def overflow_target(results: list[dict]) -> list[str]:
    mine = values_spread(overflow_values(results, "tieredkv", "ttft_p50_s"))
    theirs = values_spread(overflow_values(results, "vllm", "ttft_p50_s"))
    if mine is None or theirs is None:
        return []
    factor = theirs["median"] / mine["median"]
    sizes = [r["settings"].get("overflow", {}).get("working_set_bytes") for r in results]
    sizes = [size for size in sizes if size]
    over = f"{statistics.median(sizes) / GIB:.1f}x" if sizes else "over"
    return [
        f"| TTFT p50, chats {over} a 1 GiB KV budget (rounds 2-3) | "
        f"{cell(mine, 1000, ',.0f', 'ms')} | {cell(theirs, 1000, ',.0f', 'ms')} | "
        f"{factor:.1f}x lower | >= 5x lower than vLLM at the same RAM | "
        f"{'yes' if factor >= 5 else 'NO'} | |"
    ]


def overflow_values(results: list[dict], server: str, key: str) -> list[float]:
    values = []
    for result in results:
        entry = (result["summary"].get("overflow") or {}).get(server)
        if entry and entry.get(key) is not None:
            values.append(entry[key])
    return values

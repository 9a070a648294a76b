"""The radix tree's own cost on a multi-turn chat workload (run by benchmarks/radix_ops.py).

    .venv/bin/python benchmarks/radix_ops.py [--users 400] [--nodes 1000,10000,100000] [--json PATH]

A real TieredCache on tiny pages (radix_phases), driven the way the engine drives it
(radix_driver) by many users' multi-turn chats (radix_workload: 2.5k-3.5k-token prompts, page
size 16). Each request arrives as a new list of ints (as from a tokenizer) and is packed once
into int32 bytes, as the engine does; match and insert take the packed tokens. Reports the
packing ("pack"), match and insert p50 / p99 in µs (each call timed alone), lock and unlock, the
cost of one eviction on a full device, and match cost as the tree grows. Beside them, two
floors measured in the same run: one comparison of a 3k-token prompt as ints, and packing it
plus one memcmp. SGLang is not measured here: benchmarks/radix_vs_sglang.py replays one trace
through its RadixCache and this tree in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .radix_limits import compare_floor_us, cpu_share, packed_floor_us
from .radix_phases import chat_calls, eviction_cost, match_scaling
from .radix_profile import profile_calls


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/radix_ops.py", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--users", type=int, default=400, help="conversations in the timed workload")
    add("--active", type=int, default=64, help="users talking at once")
    add("--evictions", type=int, default=2000, help="single-page evictions timed")
    add("--evict-batch", type=int, default=64, help="pages per batched eviction")
    add("--nodes", default="1000,10000,100000", help="tree sizes for the match-cost curve")
    add("--samples", type=int, default=2000, help="matches timed at each tree size")
    add("--seed", type=int, default=0)
    add("--json", type=Path, default=None, metavar="PATH", help="also write the report here")
    add("--profile", action="store_true", help="then profile match and insert (cProfile)")
    add("--quick", action="store_true", help="tiny sizes, for tests (figures meaningless)")
    return parser


def measure(args: argparse.Namespace) -> dict[str, object]:
    share_before = cpu_share()
    floor = compare_floor_us(3000, 200, args.seed)
    packed_floor = packed_floor_us(3000, 200, args.seed)
    chat, cache = chat_calls(args.users, args.active, args.seed)
    eviction = eviction_cost(cache, args.evictions, args.evict_batch)
    del cache
    nodes = [int(n) for n in args.nodes.split(",")]
    scaling = match_scaling(nodes, args.samples, args.active, args.seed)
    report: dict[str, object] = {
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "cpu_share_before": share_before,
            "cpu_share_after": cpu_share(),
            "compare_floor_3k_tokens_us": floor,
            "packed_floor_3k_tokens_us": packed_floor,
        },
        "settings": {"seed": args.seed, "page_size": 16, "quick": args.quick},
        "chat": chat,
        "eviction": eviction,
        "match_scaling": scaling,
    }
    if args.profile:
        report["profile"] = profile_calls(args.users, args.active, args.seed)
    return report


def _p99(summary: dict) -> str:
    """The p99, or "-" where there were too few calls for one."""
    return "-" if summary["p99_us"] is None else f"{summary['p99_us']:.1f}"


def print_report(report: dict) -> None:
    chat, evict, machine = report["chat"], report["eviction"], report["machine"]
    for when in ("before", "after"):
        share = machine[f"cpu_share_{when}"]
        print(
            f"CPU share {when}: {share['share']:.0%} of a busy loop's wall time "
            f"({share['gaps_per_s']:.0f} gaps/s, median {share['median_gap_ms']:.1f} ms): "
            "on a shared machine, p99s are mostly these gaps"
        )
    print(
        f"{machine['cpus']} CPUs; floor: one comparison of a 3k-token prompt with a stored "
        f"copy takes {machine['compare_floor_3k_tokens_us']:.1f} µs here; packing it and one "
        f"memcmp with a packed copy {machine['packed_floor_3k_tokens_us']:.1f} µs"
    )
    prompts = chat["prompt_tokens"]
    print(
        f"{chat['users']} users ({chat['active_users']} at once), {chat['turns']} turns, "
        f"prompts {prompts['min']}-{prompts['max']} tokens (mean {prompts['mean']:.0f}), "
        f"tree {chat['tree_nodes']} nodes / {chat['tree_pages']} pages, "
        f"integrity {'ok' if chat['integrity_ok'] else 'FAILED'}; each prompt arrives as new "
        "int objects and is packed once (pack), match and insert take it packed"
    )
    print(f"{'call':<10}{'count':>8}{'p50 µs':>9}{'p99 µs':>9}{'mean µs':>9}")
    for name in ("pack", "match", "insert", "lock", "unlock"):
        s = chat[name]
        print(f"{name:<10}{s['count']:>8}{s['p50_us']:>9.1f}{_p99(s):>9}{s['mean_us']:>9.1f}")
    print(
        "SGLang: not measured here (benchmarks/sglang_radix.sh run measures its RadixCache "
        "beside this tree in the same run)"
    )
    for key, label in (("evict_1", "1 page"), ("evict_batch", f"{evict['batch_pages']} pages")):
        s = evict[key]
        print(
            f"evict({label}) on a full device: p50 {s['p50_us']:.1f} µs, p99 "
            f"{_p99(s)} µs, {evict[key + '_us_per_page']:.2f} µs per evicted page"
        )
    print(f"{'tree nodes':>10}{'users':>8}{'match p50 µs':>14}{'p99 µs':>9}")
    for point in report["match_scaling"]:
        m = point["match"]
        print(f"{point['tree_nodes']:>10}{point['users']:>8}{m['p50_us']:>14.1f}{_p99(m):>9}")
    for name, text in report.get("profile", {}).items():
        print(f"--- cProfile of every {name} call, by own time ---\n{text}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.users, args.active, args.evictions, args.evict_batch = 12, 4, 20, 8
        args.nodes, args.samples = "20,60", 50
    report = measure(args)
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0

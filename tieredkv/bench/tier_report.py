"""`tieredkv bench tiers`: the report as a table for people (the JSON holds the same)."""

from __future__ import annotations


def print_report(report: dict) -> None:
    limits, settings = report["limits"], report["settings"]
    print(
        f"{report['machine']['cpus']} CPUs usable, page {settings['page_bytes']:,} B, "
        f"seed {settings['seed']}, medians of {settings['reps']} after 1 warm-up, "
        f"store O_DIRECT {'on' if report['store_direct_io'] else 'OFF'}"
    )
    print(f"limits: memcpy {limits['memcpy_gbps']:.2f} GB/s, xxh3 {limits['xxh3_gbps']:.2f} GB/s")
    for r in limits["raw_patterns"]:
        print(
            f"  raw O_DIRECT {r['request_mib']} MiB x {r['in_flight']} in flight: "
            f"write {r['write_gbps']:.2f} GB/s, read {r['read_gbps']:.2f} GB/s"
        )
    print(
        f"{'path':<14}{'via':<40}{'pages':>6}{'GB/s':>8}  {'limit':<15}{'GB/s':>7}"
        f"{'share':>7}{'target':>7}"
    )
    for row in report["rows"]:
        mark = ("" if row["meets_target"] else "  MISS") + ("" if row["verified"] else "  BAD")
        print(
            f"{row['path']:<14}{row['via']:<40}{row['batch_pages']:>6}{row['gbps']:>8.2f}  "
            f"{row['limit']:<15}{row['limit_gbps']:>7.2f}{row['share']:>7.0%}"
            f"{row['target']:>7.0%}{mark}"
        )


def print_breakdown(report: dict) -> None:
    split = report.get("breakdown")
    if not split:
        return
    memcpy = report["limits"]["memcpy_gbps"]
    print(f"breakdown of the mover's jobs, {split['batch_pages']} pages (GB/s, % of memcpy):")
    for name, gbps in split["gbps"].items():
        print(f"  {name:<46}{gbps:>8.2f}{gbps / memcpy:>7.0%}")

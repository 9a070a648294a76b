"""`tieredkv bench tiers`: the report as a table for people (the JSON holds the same)."""

from __future__ import annotations


def print_report(report: dict) -> None:
    limits, settings = report["limits"], report["settings"]
    direct_io = report["store_direct_io"]
    store = "n/a" if direct_io is None else ("on" if direct_io else "OFF")
    print(
        f"{report['machine']['cpus']} CPUs usable, page {settings['page_bytes']:,} B, "
        f"seed {settings['seed']}, median (min-max) of {settings['reps']} after 1 warm-up, "
        f"store O_DIRECT {store}"
    )
    line = (
        f"limits: memcpy {limits['memcpy_gbps']:.2f} GB/s on 1 thread, "
        f"{limits['memcpy_2t_gbps']:.2f} GB/s on 2"
    )
    if "xxh3_gbps" in limits:
        line += f", xxh3 {limits['xxh3_gbps']:.2f} GB/s"
    print(line)
    for r in limits.get("raw_patterns", []):
        print(
            f"  raw O_DIRECT {r['request_mib']} MiB x {r['in_flight']} in flight: "
            f"write {r['write_gbps']:.2f} GB/s, read {r['read_gbps']:.2f} GB/s"
        )
    print(
        f"{'path':<14}{'via':<42}{'pages':>6}{'thr':>4}{'GB/s (min-max)':>20}  {'limit':<20}"
        f"{'GB/s':>7}"
        f"{'share':>7}{'target':>7}"
    )
    for row in report["rows"]:
        mark = ("" if row["meets_target"] else "  MISS") + ("" if row["verified"] else "  BAD")
        threads = "" if row["threads"] is None else row["threads"]
        print(
            f"{row['path']:<14}{row['via']:<42}{row['batch_pages']:>6}{threads:>4}"
            f"{_spread(row):>20}  {row['limit']:<20}{row['limit_gbps']:>7.2f}"
            f"{row['share']:>7.0%}{row['target']:>7.0%}{mark}"
        )


def _spread(row: dict) -> str:
    return f"{row['gbps']:.2f} ({row['gbps_min']:.2f}-{row['gbps_max']:.2f})"

"""Greedy outputs of a `tieredkv bench multiturn` report's cached run against its recompute
baseline, request by request:

    .venv/bin/python -m benchmarks.check_equal REPORT_DIR [--dtype float32|bfloat16]

(exit 1 when a float32 output differs, or nothing could be compared).

In fp32 a correct cache changes nothing, so every difference is listed with the request that
produced it. In bf16, reduced precision lets a different prefix split (cached prefix + suffix vs
one prefill) flip a near-tie, so the report gives the share of requests that diverge and where
the first divergence falls (round, character offset). Once a conversation diverges its later
prompts differ too (they carry the answers), so the first divergence per user is what counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tieredkv.bench.records import percentile

EXCERPT_CHARS = 40


def first_difference(a: str, b: str) -> int | None:
    """The first character index where `a` and `b` differ; None when equal."""
    if a == b:
        return None
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def compare_runs(cached: list[dict], baseline: list[dict], dtype: str) -> dict:
    """Compare the `records` of two runs of the same workload, request by request."""
    base = {(r["user"], r["round_index"]): r for r in baseline}
    differences = []
    compared = 0
    for record in cached:
        other = base.get((record["user"], record["round_index"]))
        if other is None or record["error"] or other["error"]:
            continue
        compared += 1
        index = first_difference(record["text"], other["text"])
        if index is not None:
            differences.append(
                {
                    "user": record["user"],
                    "round": record["round_index"],
                    "char_index": index,
                    "cached": record["text"][index : index + EXCERPT_CHARS],
                    "baseline": other["text"][index : index + EXCERPT_CHARS],
                }
            )
    first_by_user: dict[int, dict] = {}
    for diff in sorted(differences, key=lambda d: (d["round"], d["user"])):
        first_by_user.setdefault(diff["user"], diff)
    firsts = list(first_by_user.values())
    return {
        "dtype": dtype,
        "compared": compared,
        "diverged": len(differences),
        "share_diverged": len(differences) / compared if compared else None,
        "identical": compared > 0 and not differences,
        "differences": differences if dtype == "float32" else differences[:20],
        "first_divergence": {
            "users": len(firsts),
            "round_p50": percentile([d["round"] for d in firsts], 50),
            "char_index_p50": percentile([d["char_index"] for d in firsts], 50),
            "per_user": firsts,
        },
    }


def describe(result: dict) -> list[str]:
    """Human-readable lines for the report."""
    if result["compared"] == 0:
        return ["check-equal: no request could be compared"]
    if result["identical"]:
        return [f"check-equal ({result['dtype']}): all {result['compared']} outputs identical"]
    lines = [
        f"check-equal ({result['dtype']}): {result['diverged']}/{result['compared']} outputs "
        f"differ ({100 * result['share_diverged']:.1f}%)"
    ]
    if result["dtype"] == "float32":
        for d in result["differences"]:
            lines.append(
                f"  user {d['user']} round {d['round']} char {d['char_index']}: "
                f"cached {d['cached']!r} vs baseline {d['baseline']!r}"
            )
    else:
        first = result["first_divergence"]
        lines.append(
            f"  first divergence: {first['users']} users; median round {first['round_p50']}, "
            f"median char offset {first['char_index_p50']}"
        )
    return lines


def dtype_of(run: dict) -> str:
    """The dtype a managed run's server was started with (float32 when it does not say)."""
    args = run.get("server_args") or []
    return args[args.index("--dtype") + 1] if "--dtype" in args else "float32"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check_equal", description=__doc__)
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the run's own")
    args = parser.parse_args(argv)
    report = json.loads((args.report_dir / "report.json").read_text())
    runs = {run["label"]: run for run in report["runs"]}
    if report["baseline_label"] not in runs:
        parser.error("the report has no recompute baseline (a run without --no-baseline)")
    baseline = runs.pop(report["baseline_label"])
    cached = next(iter(runs.values()))
    result = compare_runs(cached["records"], baseline["records"], args.dtype or dtype_of(cached))
    (args.report_dir / "check_equal.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(describe(result)))
    differs = result["dtype"] == "float32" and not result["identical"]
    return 1 if differs or not result["compared"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

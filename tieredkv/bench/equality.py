"""`--check-equal`: greedy outputs of the cached run against the recompute baseline.

In fp32 a correct cache changes nothing, so every difference is listed with the request that
produced it. In bf16, reduced precision lets a different prefix split (cached prefix + suffix vs
one prefill) flip a near-tie, so the report gives the share of requests that diverge and where
the first divergence falls (round, character offset). Once a conversation diverges its later
prompts differ too (they carry the answers), so the first divergence per user is what counts.
"""

from __future__ import annotations

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

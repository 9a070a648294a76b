"""The burst benchmark's headline and targets, from the client-side figures of every run.

A cell is (workload, max_num_seqs, label) with label `grouped`, `lpm` or `fcfs`. Its headline is
the median over reps, with min and max, of hit tokens and makespan (medians only for the
throughputs); TTFT percentiles pool the reps' samples, and a p99 needs 100 of them. Targets per
(workload, max_num_seqs), judged on the medians: lpm reuses at least 90% of the prompt tokens
the client's own prompts make reusable (their shared prefixes, counted by the client), and
finishes the burst faster than fcfs. The server's cached-token counts are the measured reuse,
cross-checked against the shared prefixes (a request claiming more is a disagreement,
reported); the grouped run's share is printed beside. None is unknown, never zero.
"""

from __future__ import annotations

from tieredkv.bench.records import fmt, fmt_p99, fmt_spread, percentiles, ratio, spread
from tieredkv.bench.tables import markdown_table

LABELS = ("grouped", "lpm", "fcfs")
HIT_SHARE_TARGET = 0.9  # lpm hit tokens >= this x the reusable tokens
SPREAD = ("hit_tokens", "makespan_s")  # median, min and max
MEDIAN_ONLY = ("prompt_tokens", "reusable_tokens", "requests_per_s", "prompt_tokens_per_s",
               "output_tokens_per_s")  # fmt: skip


def cell_headline(runs: list[dict]) -> dict:
    """The headline of one cell's runs (its reps)."""
    ttfts = [
        r["ttft_s"]
        for run in runs
        for r in run["records"]
        if r["error"] is None and r["ttft_s"] is not None
    ]
    headline = {"reps": len(runs)}
    headline |= {name: spread([run[name] for run in runs]) for name in SPREAD}
    headline |= {name: spread([run[name] for run in runs])["median"] for name in MEDIAN_ONLY}
    preemptions = [run["preemptions"] for run in runs]
    deferrals = [run.get("deferrals") for run in runs]
    step_s = [run.get("step_s") for run in runs]
    scheduler_s = [run.get("scheduler_s") for run in runs]
    return headline | {
        "ttft_s": percentiles(ttfts),
        "ttft_samples": len(ttfts),
        "disagreements": sum(len(run["cached_over_shared"]) for run in runs),
        "preemptions": None if None in preemptions else sum(preemptions),
        "deferrals": None if None in deferrals else sum(deferrals),
        "scheduler_share": (
            None
            if None in step_s or None in scheduler_s or not sum(step_s)
            else sum(scheduler_s) / sum(step_s)
        ),
        "errors": sum(run["errors"] for run in runs),
    }


def headlines(runs: list[dict]) -> list[dict]:
    """One headline per cell, in the order cells first appear in `runs`."""
    cells: dict[tuple[str, int, str], list[dict]] = {}
    for run in runs:
        cells.setdefault((run["workload"], run["max_num_seqs"], run["label"]), []).append(run)
    return [
        {"workload": workload, "max_num_seqs": seqs, "label": label, **cell_headline(cell_runs)}
        for (workload, seqs, label), cell_runs in cells.items()
    ]


def targets(heads: list[dict]) -> list[dict]:
    """Per (workload, max_num_seqs) with all three labels: the two targets, None if unknown."""
    by_cell = {(h["workload"], h["max_num_seqs"], h["label"]): h for h in heads}
    result = []
    for workload, seqs in dict.fromkeys((h["workload"], h["max_num_seqs"]) for h in heads):
        cell = {label: by_cell.get((workload, seqs, label)) for label in LABELS}
        if None in cell.values():
            continue
        lpm, grouped = cell["lpm"], cell["grouped"]
        hit_share = ratio(lpm["hit_tokens"]["median"], lpm["reusable_tokens"])
        grouped_share = ratio(grouped["hit_tokens"]["median"], grouped["reusable_tokens"])
        lpm_s, fcfs_s = (cell[label]["makespan_s"]["median"] for label in ("lpm", "fcfs"))
        result.append(
            {
                "workload": workload,
                "max_num_seqs": seqs,
                "hit_share": hit_share,
                "hit_met": None if hit_share is None else hit_share >= HIT_SHARE_TARGET,
                "grouped_hit_share": grouped_share,
                "disagreements": sum(cell[label]["disagreements"] for label in LABELS),
                "lpm_makespan_s": lpm_s,
                "fcfs_makespan_s": fcfs_s,
                "makespan_met": None if lpm_s is None or fcfs_s is None else lpm_s < fcfs_s,
            }
        )
    return result


def headline_table(heads: list[dict]) -> str:
    header = ["workload", "seqs", "run", "reps", "hit tokens median (min-max)", "prompt tokens",
              "makespan s median (min-max)", "req/s", "prompt tok/s", "out tok/s",
              "TTFT p50 ms", "TTFT p99 ms", "preemptions", "deferred", "scheduler % of step",
              "errors"]  # fmt: skip
    rows = [
        [
            h["workload"],
            str(h["max_num_seqs"]),
            h["label"],
            str(h["reps"]),
            fmt_spread(h["hit_tokens"], ".0f"),
            fmt(h["prompt_tokens"], ".0f"),
            fmt_spread(h["makespan_s"], ".2f"),
            fmt(h["requests_per_s"], ".2f"),
            fmt(h["prompt_tokens_per_s"], ".0f"),
            fmt(h["output_tokens_per_s"], ".1f"),
            fmt(h["ttft_s"]["p50"], ".0f", 1000),
            fmt_p99(h["ttft_s"], ".0f", 1000),
            fmt(h["preemptions"], ".0f"),
            fmt(h["deferrals"], ".0f"),
            fmt(h["scheduler_share"], ".2f", 100),
            str(h["errors"]),
        ]
        for h in heads
    ]
    return markdown_table(header, rows)


def _verdict(met: bool | None) -> str:
    return {True: "PASS", False: "MISS", None: "unknown"}[met]


def targets_table(rows: list[dict]) -> str:
    header = ["workload", "seqs", "lpm hit / reusable tokens", ">= 90%",
              "grouped hit / reusable (server-reported)", "requests over their shared prefix",
              "makespan lpm / fcfs s", "lpm faster"]  # fmt: skip
    return markdown_table(
        header,
        [
            [
                t["workload"],
                str(t["max_num_seqs"]),
                fmt(t["hit_share"], ".1%"),
                _verdict(t["hit_met"]),
                fmt(t["grouped_hit_share"], ".1%"),
                str(t["disagreements"]),
                f"{fmt(t['lpm_makespan_s'], '.2f')} / {fmt(t['fcfs_makespan_s'], '.2f')}",
                _verdict(t["makespan_met"]),
            ]
            for t in rows
        ],
    )

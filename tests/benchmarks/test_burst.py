"""benchmarks/burst.py: the workload (no server), the headline and target arithmetic on made-up
runs, and one `--quick` run against two real servers (report structure only, no timings)."""

import itertools
import json
from pathlib import Path

import pytest

from benchmarks import burst
from benchmarks.burst_run import arrival_offsets, run_figures
from benchmarks.burst_summary import headline_table, headlines, targets
from benchmarks.burst_workload import (
    BurstConfig,
    arrival_order,
    grouped_order,
    reusable_tokens,
    shared_prefix_tokens,
)
from tieredkv.bench.records import P99_MIN_SAMPLES, RequestRecord, spread
from tieredkv.errors import ConfigError

SMALL = dict(groups=3, per_group=4, shared_words=80, question_words=12)


@pytest.mark.parametrize("kind", ["fewshot", "rag"])
def test_workload_is_deterministic_and_shaped(kind: str) -> None:
    config = BurstConfig(kind, **SMALL)
    requests = arrival_order(config)
    assert requests == arrival_order(BurstConfig(kind, **SMALL))  # byte-identical
    assert len(requests) == config.num_requests == 12
    assert sorted((r.group, r.index) for r in requests) == [
        (g, i) for g in range(3) for i in range(4)
    ]
    assert [(r.group, r.index) for r in requests] != [
        (r.group, r.index) for r in grouped_order(requests)
    ]
    by_group = {}
    for request in requests:
        system, user = request.messages
        assert (system["role"], user["role"]) == ("system", "user")
        by_group.setdefault(request.group, []).append(request.messages)
    for group, prompts in by_group.items():
        if kind == "fewshot":  # the template is the system message; questions differ
            assert len({p[0]["content"] for p in prompts}) == 1
            assert len(prompts[0][0]["content"].split()) >= SMALL["shared_words"]
        else:  # one system prompt for all; the user message starts with the group's document
            document = prompts[0][1]["content"].split("Query:")[0]
            assert all(p[1]["content"].startswith(document) for p in prompts), group
            assert len(document.split()) >= SMALL["shared_words"]
        assert len({p[1]["content"] for p in prompts}) == len(prompts)
    if kind == "rag":
        assert len({r.messages[0]["content"] for r in requests}) == 1
    other_seed = arrival_order(BurstConfig(kind, **SMALL, seed=1))
    assert other_seed[0].messages != requests[0].messages


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="kind"):
        BurstConfig("chat")
    with pytest.raises(ConfigError, match="per_group"):
        BurstConfig(per_group=0)


def test_poisson_offsets_are_seeded_and_increasing() -> None:
    offsets = arrival_offsets(50, 4.0, seed=0)
    assert offsets == arrival_offsets(50, 4.0, seed=0) != arrival_offsets(50, 4.0, seed=1)
    assert offsets[0] == 0.0 and all(a < b for a, b in itertools.pairwise(offsets))


def test_shared_prefixes_are_counted_from_the_prompts_alone() -> None:
    def ids(messages: list[dict]) -> list[int]:  # one "token" a character
        return [ord(c) for c in messages[0]["content"] + "|" + messages[1]["content"]]

    config = BurstConfig("fewshot", **SMALL)
    requests = arrival_order(config)
    shared = shared_prefix_tokens(requests, ids, page_size=16)
    assert set(shared) == {(g, i) for g in range(3) for i in range(4)}
    for (group, _index), tokens in shared.items():
        same = [r for r in requests if r.group == group]
        template = len(same[0].messages[0]["content"])  # the group's shared system prompt
        assert tokens % 16 == 0 and template - 16 < tokens, (tokens, template)
        assert tokens < min(len(ids(r.messages)) for r in same)
    by_group = [[shared[(g, i)] for i in range(4)] for g in range(3)]
    assert reusable_tokens(shared) == sum(sum(t) - max(t) for t in by_group)


def record(start: float, ttft: float, latency: float, cached: int | None = 50) -> RequestRecord:
    return RequestRecord(0, 0, start, ttft, latency, 100, 4, cached)


def test_run_figures() -> None:
    records = [record(10.0, 0.5, 1.0), record(10.5, 0.2, 2.5, cached=0)]
    records.append(RequestRecord(0, 0, 11.0, error="HTTP 500"))
    figures = run_figures(records, {(0, 0): 64})
    assert figures["hit_tokens"] == 50 and figures["prompt_tokens"] == 200
    assert figures["reusable_tokens"] == 0  # one request of its group: nothing to reuse
    assert figures["cached_over_shared"] == []  # 50 <= 64 shared tokens
    assert figures["makespan_s"] == 3.0  # first send (10.0) to last byte (13.0)
    assert figures["output_tokens_per_s"] == 8 / 3.0
    assert figures["errors"] == 1
    assert figures["ttft_s"]["p50"] == 0.35 and figures["ttft_s"]["p99"] is None  # n < 100
    # the server claiming more cached tokens than the prompt shares is a disagreement
    assert run_figures(records, {(0, 0): 32})["cached_over_shared"] == [[0, 0]]
    unknown = [record(0, 0.1, 1.0), record(0, 0.1, 1.0, cached=None)]
    assert run_figures(unknown, {})["hit_tokens"] is None


def made_up_run(
    label: str, hit: int, makespan: float, rep: int, num_records: int = 4, over: int = 0
) -> dict:
    records = [{"error": None, "ttft_s": 0.01 * (i + 1)} for i in range(num_records)]
    return {"workload": "fewshot", "max_num_seqs": 2, "label": label, "rep": rep,
            "hit_tokens": hit, "makespan_s": makespan, "prompt_tokens": 1200,
            "reusable_tokens": 1000, "cached_over_shared": [[0, i] for i in range(over)],
            "requests_per_s": 1.0, "prompt_tokens_per_s": 100.0, "output_tokens_per_s": 10.0,
            "preemptions": 1, "errors": 0, "records": records}  # fmt: skip


def test_headline_is_median_min_max_and_targets_use_medians() -> None:
    runs = []
    for rep, (grouped, lpm, fcfs) in enumerate([(1000, 950, 300), (1000, 850, 400), (900, 910, 0)]):
        runs.append(made_up_run("grouped", grouped, 9.0, rep))
        runs.append(made_up_run("lpm", lpm, 5.0 + rep, rep))
        runs.append(made_up_run("fcfs", fcfs, 6.5, rep, num_records=40))
    heads = headlines(runs)
    assert [h["label"] for h in heads] == ["grouped", "lpm", "fcfs"]
    lpm = heads[1]
    assert lpm["hit_tokens"] == {"n": 3, "median": 910, "min": 850, "max": 950}
    assert lpm["makespan_s"] == {"n": 3, "median": 6.0, "min": 5.0, "max": 7.0}
    assert lpm["preemptions"] == 3 and lpm["reps"] == 3
    assert lpm["ttft_samples"] == 12 and lpm["ttft_s"]["p99"] is None
    fcfs = heads[2]
    assert fcfs["ttft_samples"] == 120 >= P99_MIN_SAMPLES  # pooled over reps: a p99
    assert fcfs["ttft_s"]["p99"] is not None
    (target,) = targets(heads)
    # judged against the client's reusable tokens, not the grouped run's server count (900 in
    # rep 2 would make it easier)
    assert target["hit_share"] == 910 / 1000 and target["hit_met"] is True
    assert target["grouped_hit_share"] == 1.0 and target["disagreements"] == 0
    assert (target["lpm_makespan_s"], target["fcfs_makespan_s"]) == (6.0, 6.5)
    assert target["makespan_met"] is True
    table = headline_table(heads)
    assert "n<100" in table and "910 (850-950)" in table


def test_targets_miss_below_90_percent_and_when_not_faster() -> None:
    runs = [made_up_run("grouped", 1000, 9.0, 0), made_up_run("lpm", 899, 7.0, 0, over=2),
            made_up_run("fcfs", 300, 7.0, 0)]  # fmt: skip
    (target,) = targets(headlines(runs))
    assert target["hit_met"] is False and target["makespan_met"] is False  # a tie is no win
    assert target["disagreements"] == 2
    assert spread([1.0, None]) == {"n": 2, "median": None, "min": None, "max": None}


def test_quick_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--quick", "--threads", "1", "--out", str(out)]
    assert burst.main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [s["policy"] for s in report["servers"]] == ["lpm", "fcfs"]
    assert {"--host-cache-size", "0"} <= set(report["servers"][0]["args"])
    cells = [(r["workload"], r["label"]) for r in report["runs"]]
    assert cells == [(w, label) for w in ("fewshot", "rag") for label in ("grouped", "lpm", "fcfs")]
    for run in report["runs"]:
        assert run["errors"] == 0 and len(run["records"]) == 4
        assert run["preemptions"] is not None  # tieredkv reports it
        for rec in run["records"]:
            assert rec["error"] is None and rec["output_tokens"] == 4  # ignore_eos
            assert 0 <= rec["cached_tokens"] <= rec["prompt_tokens"]
        assert run["reusable_tokens"] > 0 and run["cached_over_shared"] == []
        if run["label"] == "grouped":
            assert run["hit_tokens"] > 0  # the second request of a group reuses its prefix
            assert [(r["group"], r["index"]) for r in run["records"]] == [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
            ]
    assert len(report["headline"]) == 6 and len(report["targets"]) == 2
    summary = (out / "summary.md").read_text()
    assert "## Targets" in summary and "| fewshot | 2 | lpm |" in summary


@pytest.mark.parametrize(
    "argv",
    [
        ["--arrival", "poisson"],
        ["--rate", "2"],
        ["--arrival", "poisson", "--rate", "0"],
        ["--workloads", "chat"],
        ["--max-num-seqs", "2,x"],
        ["--reps", "0"],
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        burst.resolve(burst.build_parser(), argv)
    assert exit_info.value.code == 2


def test_quick_fills_unset_flags_only() -> None:
    args = burst.resolve(burst.build_parser(), ["--quick", "--reps", "2"])
    assert (args.reps, args.groups, args.dtype, args.max_num_seqs) == (2, 2, "float32", [2])
    args = burst.resolve(burst.build_parser(), [])
    assert (args.groups, args.per_group, args.device_cache) == (8, 8, "96MiB")
    assert args.max_num_seqs == [2, 8] and args.workloads == ["fewshot", "rag"]

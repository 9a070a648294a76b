"""benchmarks/replicas.py: its flags (and their errors), the classification of turns by the
tier their history came from, the restart's lost conversations, the issue's ratios and the
tables, from hand-made records (the real run is tests/benchmarks/test_replicas_router_bench.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.replica_report import analyze, dominant_tier, lost_users, replicas_tables
from benchmarks.replicas import ReplicaConfig, add_replica_options, main, replicas_config
from tieredkv.bench.multiturn import build_parser, resolve
from tieredkv.bench.records import RequestRecord
from tieredkv.bench.workload_run import summaries
from tieredkv.errors import ConfigError


def parsed(*argv: str):
    parser = build_parser()
    add_replica_options(parser)
    return resolve(parser.parse_args(["--preset", "quick", *argv]))


def test_configurations_are_remote_by_policy_in_the_order_given() -> None:
    plan = replicas_config(parsed("--replicas", "3"))
    assert plan is not None and plan.num_replicas == 3
    assert plan.configurations == [ReplicaConfig(True, "cache_aware"),
                                   ReplicaConfig(True, "round_robin"),
                                   ReplicaConfig(False, "cache_aware"),
                                   ReplicaConfig(False, "round_robin")]  # fmt: skip
    assert [c.label for c in plan.configurations][::3] == ["remote + cache_aware",
                                                           "local + round_robin"]  # fmt: skip
    plan = replicas_config(parsed("--replicas", "2", "--remote", "off", "--router-policies",
                                  "round_robin"))  # fmt: skip
    assert plan is not None and plan.configurations == [ReplicaConfig(False, "round_robin")]


def test_round_robin_is_sticky_when_the_replicas_divide_the_users() -> None:
    for users, replicas, sticky in (("6", "2", True), ("5", "2", False), ("6", "4", False)):
        plan = replicas_config(parsed("--replicas", replicas, "--users", users))
        assert plan is not None and plan.round_robin_sticky is sticky, (users, replicas)
    plan = replicas_config(parsed("--replicas", "2", "--router-policies", "cache_aware"))
    assert plan is not None and not plan.round_robin_sticky


def test_the_restart_defaults_to_round_2_before_the_middle_user() -> None:
    plan = replicas_config(parsed("--replicas", "2", "--users", "5"))
    assert plan is not None and plan.restart_turn == (2, 2)
    plan = replicas_config(parsed("--replicas", "2", "--rounds", "2"))
    assert plan is not None and plan.restart_at == 0 and plan.restart_turn is None
    plan = replicas_config(parsed("--replicas", "2", "--restart-at", "1", "--users", "1"))
    assert plan is not None and plan.restart_turn == (1, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "1"], "--replicas must be >= 2"),
        (["--replicas", "2", "--restart-at", "3"], "--restart-at must be a round, 1..2"),
        (["--replicas", "2", "--restart-at", "-1"], "--restart-at"),
        (["--replicas", "2", "--remote", "maybe"], "--remote"),
        (["--replicas", "2", "--remote", "on,on"], "--remote"),
        (["--replicas", "2", "--router-policies", "fastest"], "--router-policies"),
        (["--replicas", "2", "--router-policies", "random,random"], "--router-policies"),
        (["--replicas", "2", "--base-url", "http://x"], "--base-url"),
    ],
)
def test_bad_replica_flags_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        replicas_config(parsed(*argv))


def test_bad_replica_flags_are_usage_errors_on_the_command_line(capsys) -> None:
    for argv in (["--replicas", "1"], ["--replicas", "2", "--restart-at", "3"], ["--users", "2"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--preset", "quick", *argv])
        assert exit_info.value.code == 2
    assert "--restart-at must be a round" in capsys.readouterr().err


def record(user: int, round_index: int, ttft_s: float, prompt: int = 1000, **by_tier: int) -> dict:
    tiers = {"device": 0, "host": 0, "disk": 0, "remote": 0, **by_tier}
    made = RequestRecord(user, round_index, 0.0, ttft_s, ttft_s + 1, prompt, 8,
                         sum(tiers.values()), tiers, "answer")  # fmt: skip
    return dataclasses.asdict(made)


def test_a_turn_belongs_to_the_tier_that_served_most_of_its_prompt() -> None:
    assert dominant_tier(record(0, 1, 0.1, remote=900, device=50)) == "remote"
    assert dominant_tier(record(0, 1, 0.1, disk=501)) == "disk"
    assert dominant_tier(record(0, 1, 0.1, disk=500)) is None  # half is not most
    assert dominant_tier(record(0, 1, 0.1, disk=400, remote=400)) is None  # hit, but split
    assert dominant_tier(record(0, 0, 0.1)) is None  # computed
    failed = record(0, 1, 0.1, remote=900) | {"error": "HTTP 503"}
    assert dominant_tier(failed) is None
    unknown = record(0, 1, 0.1) | {"prompt_tokens": None}
    assert dominant_tier(unknown) is None


def test_lost_conversations_are_the_first_turns_after_the_restart_that_found_nothing() -> None:
    # 3 users, restart before user 1's turn of round 1: user 0's first turn after it is in round 2
    records = [
        record(0, 1, 0.1, device=10),  # before the restart: not judged
        record(1, 1, 0.1, remote=900),
        record(2, 1, 0.1, device=100),  # reused 10%: lost
        record(0, 2, 0.1, disk=990),
        record(1, 2, 0.1),  # not its first turn after the restart
    ]
    assert lost_users(records, (1, 1)) == [2]
    assert lost_users(records, None) == []
    records[3]["error"] = "HTTP 503"
    assert lost_users(records, (1, 1)) == [0, 2]


def run_of(label: str, records: list[dict], remote: bool, restart_turn: tuple | None) -> dict:
    made = [RequestRecord(**{k: v for k, v in r.items()}) for r in records]
    restarts = [{"seconds": 12.5}] if restart_turn else []
    info = {"count": 2, "remote": remote, "router_policy": "round_robin", "restarts": restarts,
            "restart_turn": restart_turn}  # fmt: skip
    return {"label": label, "summary": summaries(made, 3), "records": records, "replicas": info}


def test_analysis_judges_the_issues_ratios_on_medians_and_renders_tables() -> None:
    routed = [
        record(0, 0, 2.0), record(1, 0, 2.0),
        record(0, 1, 0.30, remote=950), record(1, 1, 0.10, disk=950),
        record(0, 2, 0.20, remote=950), record(1, 2, 0.12, disk=950),
    ]  # fmt: skip
    baseline = {"records": [record(u, r, 3.0) for u in range(2) for r in range(3)]}
    runs = [run_of("remote + round_robin", routed, True, (2, 1)),
            run_of("local + round_robin", routed[:2], False, None)]  # fmt: skip
    runs[0]["remote_promotion"] = {"bytes": 2.4e8, "seconds": 0.3, "promotions": 4, "gbps": 0.8}
    runs[0]["redis_get"] = {"values": 800, "bytes": 2.4e8, "batch": 200, "gbps": 1.6,
                            "redis_py_gbps": 1.1, "redis_benchmark_gbps": 1.6}  # fmt: skip
    analysis = analyze(runs, baseline)
    first, second = analysis["configurations"]
    assert first["remote_hits"] == {"n": 2, "median": 0.25, "min": 0.20, "max": 0.30}
    assert first["disk_hits"]["n"] == 2 and first["disk_hits"]["median"] == pytest.approx(0.11)
    assert first["recompute_same_turns"]["n"] == 2  # the baseline's (0, 1) and (0, 2)
    assert first["recompute_over_remote"] == {"value": 12.0, "met": True}
    assert first["remote_over_disk"]["value"] == pytest.approx(0.25 / 0.11)
    assert first["remote_over_disk"]["met"] is False
    assert first["restart_s"] == [12.5] and first["no_conversation_lost"] is True
    assert first["restart_round_ttft_p50_s"] == pytest.approx(0.16)
    assert second["remote_hits"]["n"] == 0 and second["recompute_over_remote"]["met"] is None
    assert second["no_conversation_lost"] is None  # no restart
    assert analysis["pooled"]["remote_hits"]["n"] == 2

    text = replicas_tables(runs, analysis)
    assert "| remote + round_robin | 250 (200-300), n=2 |" in text
    assert "12.0x met" in text and "2.3x missed" in text and "| all configurations |" in text
    assert "The restart loses no conversation with the remote tier on: met." in text
    # the bandwidth of the one configuration with the remote tier, beside its limit
    assert "| remote + round_robin | 4 | 240.0 | 0.80 | 1.60 | 1.10 / 1.60 | 200 | 50% |" in text
    tables = [part for part in text.split("\n\n") if part.startswith("|")]
    assert len(tables) == 3
    for table in tables:  # every row as wide as its header
        assert len({line.count("|") for line in table.splitlines()}) == 1, table


def test_a_conversation_lost_in_the_restart_misses_the_target() -> None:
    routed = [record(0, 0, 2.0), record(0, 1, 2.0, device=10)]  # found nothing after restart
    runs = [run_of("remote + cache_aware", routed, True, (1, 0))]
    analysis = analyze(runs, None)
    assert analysis["configurations"][0]["lost_after_restart"] == [0]
    text = replicas_tables(runs, analysis)
    assert "| users 0 |" in text and "remote tier on: missed." in text
    assert "| none | none | none |" in text  # no Redis, disk or recompute turns to show

"""The client and one whole run against fake OpenAI servers (tieredkv-like and plain)."""

import pytest
from bench_fakes import FakeServer

from tieredkv.bench.client import parse_usage
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.records import RequestRecord
from tieredkv.bench.workload import Workload, WorkloadConfig
from tieredkv.bench.workload_run import run_workload
from tieredkv.errors import ConfigError

SMALL = WorkloadConfig(num_users=3, num_rounds=3, system_words=10, document_words=20, max_tokens=8)


def test_usage_fields_absent_or_null_stay_unknown() -> None:
    record = RequestRecord(user=0, round_index=0, start_s=0.0)
    parse_usage({"prompt_tokens": 10, "completion_tokens": 2}, record)
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (10, 2, None)
    assert record.cached_by_tier == {"device": None, "host": None, "disk": None, "remote": None}
    parse_usage({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": None}}, record)
    assert record.cached_tokens is None
    details = {"cached_tokens": 0, "cached_tokens_by_tier": {"device": 0, "host": 0}}
    parse_usage({"prompt_tokens": 10, "prompt_tokens_details": details}, record)
    assert record.cached_tokens == 0
    assert record.cached_by_tier == {"device": 0, "host": 0, "disk": None, "remote": None}


def test_round_robin_run_against_a_tieredkv_like_server() -> None:
    server = FakeServer(tieredkv=True)
    run = run_workload(
        "http://fake", Workload(SMALL), ArrivalConfig(2), transport=server.transport()
    )
    records = run["records"]
    assert [(r["round_index"], r["user"]) for r in records] == [
        (i, u) for i in range(3) for u in range(3)
    ]
    assert all(r["error"] is None and r["ttft_s"] is not None for r in records)
    assert records[0]["text"] == "Answer to turn 2 about the report."
    # the next turn carries the actual previous answer
    second = next(b for b in server.bodies if len(b["messages"]) == 4)
    assert second["messages"][2] == {
        "role": "assistant",
        "content": "Answer to turn 2 about the report.",
    }
    assert all(
        b["stream_options"] == {"include_usage": True} and b["temperature"] == 0
        for b in server.bodies
    )
    reuse = run["summary"]["reuse_rounds"]
    assert reuse["hit_ratio_by_tier"]["device"] == 0.0
    assert reuse["hit_ratio_by_tier"]["disk"] > 0
    assert run["summary"]["by_round"][0]["hit_ratio"] == 0.0
    assert run["metrics_available"] is True
    assert run["direct_io"] is True  # from /health
    assert run["promotion"]["disk"]["count"] == 6  # rounds 1 and 2, three users
    assert run["promotion"]["disk"]["bytes_per_promotion"] == 4096.0


def test_a_plain_server_reports_unknown_not_zero() -> None:
    server = FakeServer(tieredkv=False)
    run = run_workload(
        "http://fake", Workload(SMALL), ArrivalConfig(1), transport=server.transport()
    )
    reuse = run["summary"]["reuse_rounds"]
    assert reuse["prompt_tokens"] > 0
    assert reuse["hit_ratio"] is None
    assert reuse["hit_ratio_by_tier"] == {
        "device": None,
        "host": None,
        "disk": None,
        "remote": None,
    }
    assert run["metrics_available"] is False
    assert run["direct_io"] is None
    assert run["promotion"]["disk"]["p50_s"] is None


def test_poisson_arrivals_keep_each_conversation_in_order() -> None:
    server = FakeServer(tieredkv=True)
    rounds_seen: dict[int, list[int]] = {}
    run = run_workload(
        "http://fake",
        Workload(SMALL),
        ArrivalConfig(3, rate_per_s=500.0),
        transport=server.transport(),
    )
    for body in server.bodies:
        user_text = body["messages"][1]["content"]
        rounds_seen.setdefault(hash(user_text), []).append(len(body["messages"]))
    assert all(seen == [2, 4, 6] for seen in rounds_seen.values())
    assert len(run["records"]) == 9


def test_before_round_hook_runs_once_per_round() -> None:
    calls: list[int] = []
    run_workload("http://fake", Workload(SMALL), ArrivalConfig(1), calls.append,
                 transport=FakeServer(True).transport())  # fmt: skip
    assert calls == [0, 1, 2]


def test_before_turn_hook_runs_before_each_turn_with_the_earlier_turns_done() -> None:
    server = FakeServer(True)
    calls: list[tuple[int, int, int]] = []  # (round, user, requests the server had seen)

    def before_turn(round_index: int, user: int) -> None:
        calls.append((round_index, user, len(server.bodies)))

    run = run_workload("http://fake", Workload(SMALL), ArrivalConfig(1), label="hooked",
                       transport=server.transport(), before_turn=before_turn)  # fmt: skip
    users = SMALL.num_users
    assert [(r, u) for r, u, _ in calls] == [(r, u) for r in range(3) for u in range(users)]
    assert [seen for _, _, seen in calls] == list(range(3 * users))
    assert run["summary"]["overall"]["errors"] == 0


def test_bad_arrival_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="concurrency"):
        ArrivalConfig(0)
    with pytest.raises(ConfigError, match="rate_per_s"):
        ArrivalConfig(1, rate_per_s=-1.0)


def test_cli_errors_are_one_line_not_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    from tieredkv.bench.multiturn import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--users", "none"])
    assert exit_info.value.code == 2
    # a server that is not there: exit 1 with a message
    assert main(["--base-url", "http://127.0.0.1:9", "--preset", "quick"]) == 1
    assert "tieredkv bench multiturn: error:" in capsys.readouterr().err

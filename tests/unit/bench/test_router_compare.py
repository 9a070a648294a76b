"""The router benchmark's pure parts: the multi-tenant workload, the replicas' flags, the
command line, and the summary and docs table built from result records."""

from __future__ import annotations

import itertools
import random

import pytest

from benchmarks import router_compare, router_report
from benchmarks.router_workload import TenantWorkloadConfig, build_requests, system_prompts
from tieredkv.errors import ConfigError

SMALL = TenantWorkloadConfig(num_tenants=4, system_words=50, num_requests=40, rate=2.0, seed=3)


def test_workload_is_a_function_of_its_seed() -> None:
    assert build_requests(SMALL) == build_requests(SMALL)
    other = build_requests(TenantWorkloadConfig(4, 50, 40, 2.0, seed=4))
    assert [r.prompt for r in other] != [r.prompt for r in build_requests(SMALL)]


def test_each_prompt_starts_with_its_tenants_system_prompt() -> None:
    systems = system_prompts(SMALL, random.Random(SMALL.seed))
    requests = build_requests(SMALL)
    assert len(requests) == 40 and [r.index for r in requests] == list(range(40))
    for request in requests:
        assert request.prompt.startswith(systems[request.tenant] + "\n\nQuestion: ")
    assert len(set(systems)) == 4
    assert {r.tenant for r in requests} == set(range(4))


def test_arrivals_start_at_zero_and_never_go_back() -> None:
    arrivals = [r.arrival_s for r in build_requests(SMALL)]
    assert arrivals[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(arrivals))
    assert arrivals[-1] > 0


@pytest.mark.parametrize("field, value", [("num_tenants", 0), ("num_requests", 0),
                                          ("system_words", 0), ("rate", 0.0)])  # fmt: skip
def test_config_names_the_bad_field(field: str, value: float) -> None:
    values = {"num_tenants": 2, "system_words": 5, "num_requests": 3, "rate": 1.0, field: value}
    with pytest.raises(ConfigError, match=field):
        TenantWorkloadConfig(**values)


def test_quick_preset_and_replica_flags() -> None:
    args = router_compare.parse_args(["--quick", "--remote", "off", "--routers", "dynamo"])
    assert (args.replicas, args.tenants, args.remote_list, args.router_list) == (
        2, 3, [False], ["dynamo"])  # fmt: skip
    flags = router_compare.replica_args(args, 5557, [])
    assert flags[flags.index("--kv-events-endpoint") + 1] == "tcp://*:5557"
    assert "--remote-cache-url" not in flags
    remote_flags = ["--remote-cache-url", "redis://127.0.0.1:6379/0", "--remote-secret-file", "s"]
    remote = router_compare.replica_args(args, 5557, remote_flags)
    assert remote[-4:] == remote_flags


def test_unknown_router_is_refused() -> None:
    with pytest.raises(ConfigError, match="--routers"):
        router_compare.parse_args(["--quick", "--routers", "dynamo,nearest"])


def record(router: str, remote: bool, ttfts: list[float | None], reused: dict, prompt: int):
    rows = [{"ttft_s": t, "error": None if t is not None else "HTTP 500: x"} for t in ttfts]
    return {"router": router, "remote": remote, "rep": 0, "requests": rows,
            "reused_by_tier": reused, "prompt_tokens": prompt}  # fmt: skip


def test_summary_pools_ttfts_and_takes_reuse_from_the_counters() -> None:
    tiers = {"device": 300.0, "host": 100.0, "disk": 0.0, "remote": 0.0}
    records = [
        record("dynamo", False, [0.1, 0.2, 0.3], tiers, 800),
        record("dynamo", False, [0.4, None], {**tiers, "device": 500.0}, 800),
        record("round_robin", False, [1.0], dict.fromkeys(tiers, 0.0), 800),
    ]
    summary = router_report.summarize(records)
    dynamo, rr = summary["configs"]
    assert (dynamo["router"], dynamo["reps"], dynamo["requests"], dynamo["errors"]) == (
        "dynamo", 2, 5, 1)  # fmt: skip
    assert dynamo["ttft_p50_s"] == pytest.approx(0.25)
    assert dynamo["reused_tokens"] == {"median": 500.0, "min": 400.0, "max": 600.0}
    assert dynamo["reused_share"]["median"] == pytest.approx(500 / 800)
    assert dynamo["reused_by_tier"]["device"] == 400.0
    assert rr["reused_tokens"]["median"] == 0.0 and rr["ttft_p50_s"] == 1.0

    text = router_report.table(summary)
    assert "| off | NVIDIA Dynamo KV router (KV events) | 250 |" in text
    assert "500 (400-600)" in text and "1 of 5" in text


def test_render_markdown_names_the_result_and_its_settings() -> None:
    args = router_compare.parse_args(["--quick"])
    settings = {k: v for k, v in vars(args).items() if k not in ("remote_list", "router_list")}
    tiers = {"device": 10.0, "host": 0.0, "disk": 0.0, "remote": 5.0}
    summary = router_report.summarize([record("cache_aware", True, [0.5], tiers, 40)])
    machine = {"cpu_model": "cpu", "cpu_flags": ["avx512_bf16"], "cores": 2, "mem_total_gib": 8}
    result = {"dir": "router_compare/x", "settings": settings, "machine": machine,
              "summary": summary}  # fmt: skip
    page = router_compare.render_markdown([result])
    assert page.startswith("## Routers over replicas")
    assert "`router_compare/x`" in page and "sglang-router cache_aware" in page
    assert "| on |" in page

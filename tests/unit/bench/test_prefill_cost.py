"""The suffix prefill cost model and the TTFT bound that uses it."""

import copy

import pytest

from tieredkv.bench.prefill_cost import PrefillCost, load_prefill_cost
from tieredkv.bench.targets import evaluate
from tieredkv.config import ModelConfig

SMOL = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                   num_heads=9, num_kv_heads=3, head_dim=64)  # fmt: skip


def test_flops_add_up_and_grow_with_the_prefix() -> None:
    cost = PrefillCost.of(SMOL)
    # q 576 + k 192 + v 192 wide, o 576, MLP 3 x 576 x 1536; x2 FLOPs per MAC, 30 layers
    assert cost.linear_flops_per_token == 2 * 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536)
    assert cost.attention_flops_per_pair == 4 * 30 * 576
    assert cost.flops(0, 3000) + cost.flops(3000, 200) == pytest.approx(cost.flops(0, 3200))
    assert cost.flops(3000, 32) > 1.9 * cost.flops(0, 32)  # deep queries cost about twice
    share = cost.suffix_share(3264, 3232)
    # more than the suffix's share of the tokens, far less than the whole
    assert 32 / 3264 < share < 0.05
    assert cost.suffix_share(100, 0) == 1.0


def test_load_prefill_cost_of_a_missing_model_is_none(tmp_path) -> None:
    assert load_prefill_cost(str(tmp_path / "nothing-here")) is None


def disk_runs(ttft: float) -> tuple[dict, dict]:
    """One request with 3,200 of 3,264 prompt tokens from disk; recompute took 7.5 s."""
    record = {"user": 0, "round_index": 1, "error": None, "prompt_tokens": 3264,
              "cached_tokens": 3200,
              "cached_by_tier": {"device": 0, "host": 0, "disk": 3200, "remote": 0},
              "ttft_s": ttft}  # fmt: skip
    cached = {"records": [record],
              "promotion": {"disk": {"bytes_moved": 3200 * 1000, "bytes_per_promotion": 3.2e6,
                                     "p50_s": 0.003}}}  # fmt: skip
    base = copy.deepcopy(record) | {"cached_tokens": 0, "ttft_s": 7.5}
    base["cached_by_tier"] = {"device": 0, "host": 0, "disk": 0, "remote": 0}
    return cached, {"records": [base]}


def test_bound_rules_judge_independently_and_report_every_rule() -> None:
    cost = PrefillCost.of(SMOL)
    transfer = 3.2e6 / 1e9  # bytes / disk bandwidth
    share_s = 7.5 * cost.suffix_share(3264, 3200)
    average_s = 64 / (3264 / 7.5)
    assert share_s > average_s + 0.01
    between = transfer + (share_s + average_s) / 2 + 0.050  # meets one rule, not the other
    targets = evaluate(*disk_runs(between), disk_bytes_per_s=1e9, cost=cost)
    rules = targets["ttft_within_bound_rules"]
    assert set(rules) == {"flop_share", "average_speed"}  # no server timings in these records
    assert rules["flop_share"]["met"] is True and rules["average_speed"]["met"] is False
    assert rules["flop_share"]["margin_min_s"] == pytest.approx(transfer + share_s + 0.05 - between)
    assert targets["ttft_within_bound"]["met"] is True  # the first rule with values
    assert targets["ttft_within_bound"]["suffix_prefill"].startswith("FLOP share")
    too_slow = transfer + share_s + 0.060
    assert evaluate(*disk_runs(too_slow), 1e9, cost)["ttft_within_bound"]["met"] is False
    no_cost = evaluate(*disk_runs(between), 1e9)
    assert no_cost["ttft_within_bound"]["met"] is False  # falls back to the average rule
    assert set(no_cost["ttft_within_bound_rules"]) == {"average_speed"}
    # the server's own first-forward-to-first-token time is reported, never the judge
    cached, baseline = disk_runs(too_slow)
    cached["records"][0] |= {"server_queue_s": 0.001, "server_ttft_s": too_slow - 0.01}
    timed = evaluate(cached, baseline, 1e9, cost)
    assert timed["ttft_within_bound_rules"]["server"]["met"] is True  # it would pass itself
    assert timed["ttft_within_bound"]["suffix_prefill"].startswith("FLOP share")
    assert timed["ttft_within_bound"]["met"] is False
    unknown = evaluate(cached, baseline, None, cost)
    assert unknown["ttft_within_bound"]["met"] is None and not unknown["ttft_within_bound_rules"]

"""The prefill cost model, the KV bytes of a history, and the TTFT bound that uses them."""

import pytest

from tieredkv.bench.prefill_cost import PrefillCost, load_model_cost
from tieredkv.bench.targets import evaluate, targets_table
from tieredkv.model_config import ModelConfig

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


def test_load_model_cost_knows_the_kv_bytes_and_a_missing_model_is_none(tmp_path) -> None:
    assert load_model_cost(str(tmp_path / "nothing-here")) is None
    cost = load_model_cost(None, "bfloat16", 16)  # the default model: SmolLM2-135M
    # 30 layers x K and V x 3 kv heads x 64 dims x 2 bytes, 16 tokens a page
    assert cost is not None and cost.page_bytes == 30 * 2 * 3 * 64 * 2 * 16
    assert cost.history_bytes(3201) == 200 * cost.page_bytes  # whole pages only


PAGE_BYTES = 16_000  # 1,000 B a token: the 3,200-token history is 3.2 MB


def disk_runs(ttft: float, cached_tokens: int = 3200, disk_tokens: int = 3200) -> tuple[dict, dict]:
    """User 0: round 0 builds a 3,200-token history (3,100 prompt + 100 answer tokens); round 1
    sends 3,264 tokens, the server saying `cached_tokens` were cached (`disk_tokens` from
    disk); recomputing round 1 took 7.5 s."""

    def record(round_index: int, prompt: int, output: int, cached: int, disk: int, ttft_s: float):
        return {"user": 0, "round_index": round_index, "error": None, "prompt_tokens": prompt,
                "output_tokens": output, "cached_tokens": cached, "ttft_s": ttft_s,
                "cached_by_tier": {"device": cached - disk, "host": 0, "disk": disk,
                                   "remote": 0}}  # fmt: skip

    cached = {"records": [record(0, 3100, 100, 0, 0, 7.0),
                          record(1, 3264, 8, cached_tokens, disk_tokens, ttft)],
              "promotion": {"disk": {"bytes_per_promotion": 3.2e6, "p50_s": 0.0048}}}  # fmt: skip
    baseline = {"records": [record(0, 3100, 100, 0, 0, 7.0), record(1, 3264, 8, 0, 0, 7.5)]}
    return cached, baseline


def test_the_bound_counts_the_clients_history_and_judges_independently() -> None:
    cost = PrefillCost.of(SMOL, PAGE_BYTES, 16)
    transfer = 3.2e6 / 1e9  # the history's bytes / disk limit
    share_s = 7.5 * cost.suffix_share(3264, 3200)
    average_s = 64 / (3264 / 7.5)
    # the suffix attends to the whole history: its FLOP share exceeds its share of the length
    assert share_s > average_s + 0.01
    between = transfer + (share_s + average_s) / 2 + 0.050  # within the FLOP-share bound
    targets = evaluate(*disk_runs(between), disk_bytes_per_s=1e9, cost=cost)
    assert targets["long_reuse_turns"] == 1  # round 0 has no history to reuse
    within = targets["ttft_within_bound"]
    assert within["met"] is True and within["value"] == 1.0
    assert within["margin_min_s"] == pytest.approx(transfer + share_s + 0.05 - between)
    assert targets["ttft_speedup_vs_recompute_p50"]["value"] == pytest.approx(7.5 / between)
    too_slow = transfer + share_s + 0.060
    assert evaluate(*disk_runs(too_slow), 1e9, cost)["ttft_within_bound"]["met"] is False
    unknown = evaluate(*disk_runs(between), None, cost)["ttft_within_bound"]
    assert unknown["met"] is None and unknown["value"] is None
    assert evaluate(*disk_runs(between), 1e9)["ttft_within_bound"]["met"] is None  # no model


def test_the_servers_counts_are_cross_checked_never_the_allowance() -> None:
    cost = PrefillCost.of(SMOL, PAGE_BYTES, 16)
    ttft = 3.2e6 / 1e9 + 7.5 * cost.suffix_share(3264, 3200) + 0.04
    honest = evaluate(*disk_runs(ttft), 1e9, cost)
    assert honest["server_check"] == {"turns_from_disk": 1, "cached_over_history": []}
    # the server claims more cached tokens than the history holds, and none from disk: it is
    # reported, and the bound (from the client's history) does not move
    claims = evaluate(*disk_runs(ttft, cached_tokens=3248, disk_tokens=0), 1e9, cost)
    assert claims["server_check"] == {"turns_from_disk": 0, "cached_over_history": [[0, 1]]}
    assert claims["ttft_within_bound"] == honest["ttft_within_bound"]
    # the server's own promotion histogram is a diagnostic: a figure, never a verdict
    promo = honest["server_promotion_p50_over_ideal"]
    assert promo["value"] == pytest.approx(1.5) and "met" not in promo
    table = targets_table(claims)
    assert "Server-reported (diagnostics, not targets)" in table and "DISAGREES" in table


def test_a_workload_without_long_turns_judges_no_target() -> None:
    cost = PrefillCost.of(SMOL, PAGE_BYTES, 16)
    cached, baseline = disk_runs(0.2)
    for run in (cached, baseline):  # a quick preset's conversations: a few hundred tokens
        for record in run["records"]:
            record["prompt_tokens"] = 560
    targets = evaluate(cached, baseline, 1e9, cost)
    assert targets["long_reuse_turns"] == 0
    table = targets_table(targets)
    assert table.startswith("No target judged") and "NO" not in table and "unknown" not in table

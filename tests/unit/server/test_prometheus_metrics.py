"""EngineMetrics and the Prometheus registry: parse the exposition text back and check it."""

import itertools
import math
import re
import threading

import pytest

from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.tier import Tier
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.protocol import FinishReason
from tieredkv.prometheus_format import Counter, Histogram, Registry

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# The contract table: name -> (type, label names)
CONTRACT = {
    "tieredkv_prompt_tokens_total": ("counter", ()),
    "tieredkv_generation_tokens_total": ("counter", ()),
    "tieredkv_cache_hit_tokens_total": ("counter", ("tier",)),
    "tieredkv_promotion_seconds": ("histogram", ("from_tier",)),
    "tieredkv_transfer_bytes_total": ("counter", ("from_tier", "to_tier")),
    "tieredkv_tier_used_bytes": ("gauge", ("tier",)),
    "tieredkv_tier_capacity_bytes": ("gauge", ("tier",)),
    "tieredkv_evicted_pages_total": ("counter", ("tier", "action")),
    "tieredkv_disk_page_errors_total": ("counter", ("reason",)),
    "tieredkv_time_to_first_token_seconds": ("histogram", ()),
    "tieredkv_time_per_output_token_seconds": ("histogram", ()),
    "tieredkv_e2e_request_latency_seconds": ("histogram", ()),
    "tieredkv_queue_seconds": ("histogram", ()),
    "tieredkv_requests_running": ("gauge", ()),
    "tieredkv_requests_waiting": ("gauge", ()),
    "tieredkv_request_success_total": ("counter", ("finished_reason",)),
    "tieredkv_preemptions_total": ("counter", ()),
}
# beyond the contract, each stated in docs/operations.md
EXTENSIONS = {
    "tieredkv_deferred_admissions_total": ("counter", ()),
    "tieredkv_remote_page_errors_total": ("counter", ("reason",)),
    "tieredkv_prefill_tokens_total": ("counter", ()),
    "tieredkv_step_seconds_total": ("counter", ()),
    "tieredkv_scheduler_seconds_total": ("counter", ()),
    "tieredkv_kv_events_published_total": ("counter", ()),
    "tieredkv_kv_events_dropped_total": ("counter", ()),
    "tieredkv_retained_pages": ("gauge", ("tier",)),
    "tieredkv_retention_evicted_total": ("counter", ()),
    "tieredkv_tier_cached_tokens": ("gauge", ("tier", "layer_kind")),
}
DECLARED = CONTRACT | EXTENSIONS


def parse(text):
    """-> (types, helps, samples): samples maps (name, frozenset(labels)) -> float."""
    assert text.endswith("\n")
    types, helps, samples = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            types[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"bad sample line {line!r}"
            labels = frozenset(_LABEL.findall(match.group(3) or ""))
            key = (match.group(1), labels)
            assert key not in samples, f"duplicate series {key}"
            samples[key] = float(match.group(4))
    return types, helps, samples


def family_of(sample_name, types):
    for suffix in ("_bucket", "_sum", "_count", ""):
        base = sample_name.removesuffix(suffix) if suffix else sample_name
        if base in types and (suffix == "" or types[base] == "histogram"):
            return base
    raise AssertionError(f"sample {sample_name} has no # TYPE")


def test_every_contract_metric_is_declared_with_its_type_and_labels():
    types, helps, samples = parse(EngineMetrics().render())
    assert types == {name: kind for name, (kind, _) in DECLARED.items()}
    assert set(helps) == set(DECLARED) and all(helps.values())
    for (name, labels), _ in samples.items():
        family = family_of(name, types)
        names = {k for k, _ in labels} - ({"le"} if name.endswith("_bucket") else set())
        assert names == set(DECLARED[family][1]), (name, labels)


def test_known_series_start_at_zero():
    _, _, samples = parse(EngineMetrics().render())
    for tier in ("device", "host", "disk"):
        assert samples["tieredkv_cache_hit_tokens_total", frozenset({("tier", tier)})] == 0
        for action in ("demoted", "dropped"):
            key = frozenset({("tier", tier), ("action", action)})
            assert samples["tieredkv_evicted_pages_total", key] == 0
    for reason in ("stop", "length", "abort"):
        key = frozenset({("finished_reason", reason)})
        assert samples["tieredkv_request_success_total", key] == 0
    for reason in ("checksum", "fingerprint", "io"):
        assert samples["tieredkv_disk_page_errors_total", frozenset({("reason", reason)})] == 0


def test_promotion_buckets_double_from_one_millisecond_to_sixteen_seconds():
    _, _, samples = parse(EngineMetrics().render())
    bounds = sorted(
        float(dict(labels)["le"])
        for name, labels in samples
        if name == "tieredkv_promotion_seconds_bucket" and ("from_tier", "host") in labels
    )
    assert bounds[-1] == math.inf
    finite = bounds[:-1]
    assert finite[0] == pytest.approx(0.001) and 16 <= finite[-1] < 17
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(finite))


def test_engine_calls_move_the_right_series():
    metrics = EngineMetrics()
    metrics.on_request_arrived(100)
    metrics.on_request_arrived(28)
    metrics.on_tokens_generated(5)
    metrics.on_first_forward(0.002)
    metrics.on_first_token(0.2)
    metrics.on_promotion(Tier.DISK, 0.003)
    metrics.on_promotion(Tier.DISK, 20.0)
    metrics.on_preemption()
    metrics.on_request_finished(FinishReason.LENGTH, 1.2, 5, 0.2)
    metrics.on_request_finished(FinishReason.ERROR, 0.5, 0, None)
    metrics.set_queue_sizes(3, 7)
    _, _, s = parse(metrics.render())
    nolabel = frozenset()
    assert s["tieredkv_prompt_tokens_total", nolabel] == 128
    assert s["tieredkv_generation_tokens_total", nolabel] == 5
    assert s["tieredkv_preemptions_total", nolabel] == 1
    assert s["tieredkv_requests_running", nolabel] == 3
    assert s["tieredkv_requests_waiting", nolabel] == 7
    assert s["tieredkv_request_success_total", frozenset({("finished_reason", "length")})] == 1
    assert s["tieredkv_request_success_total", frozenset({("finished_reason", "stop")})] == 0
    disk = frozenset({("from_tier", "disk")})
    assert s["tieredkv_promotion_seconds_count", disk] == 2
    assert s["tieredkv_promotion_seconds_sum", disk] == pytest.approx(20.003)
    assert s["tieredkv_promotion_seconds_bucket", disk | {("le", "0.004")}] == 1
    assert s["tieredkv_promotion_seconds_bucket", disk | {("le", "+Inf")}] == 2
    assert s["tieredkv_promotion_seconds_count", frozenset({("from_tier", "host")})] == 0
    assert s["tieredkv_e2e_request_latency_seconds_count", nolabel] == 2
    # one TPOT observation: (1.2 - 0.2) / 4 output gaps
    assert s["tieredkv_time_per_output_token_seconds_sum", nolabel] == pytest.approx(0.25)
    assert s["tieredkv_time_to_first_token_seconds_count", nolabel] == 1
    assert s["tieredkv_queue_seconds_bucket", frozenset({("le", "0.001")})] == 0
    assert s["tieredkv_queue_seconds_bucket", frozenset({("le", "0.005")})] == 1


def test_set_cache_totals_and_tier_bytes_mirror_the_cache_counters_and_sizes():
    metrics = EngineMetrics()
    counters = CacheCounters()
    counters.on_hit(Tier.HOST, 64)
    counters.on_transfer(Tier.HOST, Tier.DEVICE, 4096)
    counters.on_eviction(Tier.DEVICE, 3, demoted=True)
    used = {Tier.DEVICE: 1000, Tier.HOST: 10}
    capacity = {Tier.DEVICE: 2000, Tier.HOST: 20, Tier.DISK: 0}
    errors = {DiskErrorReason.CHECKSUM: 2, DiskErrorReason.FINGERPRINT: 0, DiskErrorReason.IO: 1}
    remote_errors = {"corrupt": 1, "fingerprint": 0, "key": 0, "unavailable": 5}
    for _ in range(2):  # a total, not an increment
        metrics.set_cache_totals(counters, errors, remote_errors)
        metrics.set_tier_bytes(used, capacity)
        metrics.set_hit_tokens({Tier.HOST: 48})
    _, _, s = parse(metrics.render())
    assert s["tieredkv_cache_hit_tokens_total", frozenset({("tier", "host")})] == 48
    pair = frozenset({("from_tier", "host"), ("to_tier", "device")})
    assert s["tieredkv_transfer_bytes_total", pair] == 4096
    demoted = frozenset({("tier", "device"), ("action", "demoted")})
    assert s["tieredkv_evicted_pages_total", demoted] == 3
    assert s["tieredkv_disk_page_errors_total", frozenset({("reason", "checksum")})] == 2
    assert s["tieredkv_disk_page_errors_total", frozenset({("reason", "io")})] == 1
    assert s["tieredkv_remote_page_errors_total", frozenset({("reason", "unavailable")})] == 5
    assert s["tieredkv_tier_used_bytes", frozenset({("tier", "device")})] == 1000
    assert s["tieredkv_tier_used_bytes", frozenset({("tier", "disk")})] == 0
    assert s["tieredkv_tier_capacity_bytes", frozenset({("tier", "host")})] == 20


def test_label_values_are_escaped_and_parse_back():
    registry = Registry()
    counter = registry.register(Counter("x_total", "help with \\ and\nnewline", ("path",)))
    counter.inc(2, path='a"b\\c\nd')
    text = registry.render()
    assert "# HELP x_total help with \\\\ and\\nnewline" in text
    _, _, samples = parse(text)
    assert samples["x_total", frozenset({("path", 'a\\"b\\\\c\\nd')})] == 2


def test_counters_refuse_to_go_down_and_labels_must_match():
    counter = Counter("c_total", "c", ("tier",))
    with pytest.raises(ValueError):
        counter.inc(-1, tier="host")
    with pytest.raises(ValueError):
        counter.inc(1, wrong="host")
    counter.set_total(10, tier="host")
    counter.set_total(4, tier="host")
    assert counter.value(tier="host") == 10
    with pytest.raises(ValueError):
        Histogram("h", "h", [1.0]).observe(float("nan"))


def test_concurrent_updates_are_not_lost():
    histogram = Histogram("h", "h", [0.5, 1.0])
    counter = Counter("c_total", "c")

    def work():
        for _ in range(2000):
            histogram.observe(0.7)
            counter.inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.value() == 8000 and histogram.count() == 8000
    _, _, samples = parse("\n".join(histogram.render()) + "\n")
    assert samples["h_bucket", frozenset({("le", "0.5")})] == 0
    assert samples["h_bucket", frozenset({("le", "1")})] == 8000
    assert samples["h_sum", frozenset()] == pytest.approx(5600)


def test_every_metric_beyond_the_contract_is_stated_in_the_docs():
    from pathlib import Path

    docs = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    assert [name for name in EXTENSIONS if f"`{name}`" not in docs] == []

"""`EngineRecorder`: what the engine's requests and steps move in `EngineMetrics`."""

from tests.support.tiny_cache import make_cache, tiny_layout
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.disk.error_reason import DiskErrorReason
from tieredkv.cache.metrics import CacheCounters
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import DEFAULT_NAMESPACE
from tieredkv.engine.engine_recorder import EngineRecorder, StepFigures
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.protocol import GenerationRequest
from tieredkv.engine.request import Request
from tieredkv.model.sampler import SamplingParams


def _request(host_tokens: int, num_preemptions: int) -> Request:
    spec = GenerationRequest("r", tuple(range(40)), SamplingParams(max_tokens=4))
    kv = CacheHandle(make_cache(tiny_layout(), device_pages=4)[0], DEFAULT_NAMESPACE)
    request = Request(spec, seq_id=0, output=None, generator=None, kv=kv)  # type: ignore[arg-type]
    request.cached_by_tier[Tier.DEVICE] = 8
    request.cached_by_tier[Tier.HOST] = host_tokens
    request.promotion_seconds = 0.01
    request.num_preemptions = num_preemptions
    return request


def _figures(counters: CacheCounters) -> StepFigures:
    return StepFigures(
        step_seconds=0.5,
        scheduler_seconds=0.1,
        num_running=1,
        num_waiting=2,
        cache_counters=counters,
        tier_used_bytes={Tier.DEVICE: 100},
        tier_capacity_bytes={Tier.DEVICE: 400},
        tier_cached_tokens={
            "full": {Tier.DEVICE: 48, Tier.HOST: 32, Tier.DISK: 0, Tier.REMOTE: 0},
            "sliding": {Tier.DEVICE: 48, Tier.HOST: 16, Tier.DISK: 0, Tier.REMOTE: 0},
        },
        disk_page_errors=dict.fromkeys(DiskErrorReason, 0),
        remote_page_errors={"corrupt": 0, "fingerprint": 0, "key": 0, "unavailable": 3},
    )


def test_hit_tokens_count_a_request_at_its_first_admission_only() -> None:
    metrics = EngineMetrics()
    recorder = EngineRecorder(metrics)
    recorder.on_promotion_done(_request(host_tokens=16, num_preemptions=0))
    recorder.on_promotion_done(_request(host_tokens=16, num_preemptions=1))  # re-admitted
    counters = CacheCounters()
    counters.on_hit(Tier.HOST, 32)  # the cache promoted the 16 tokens twice
    recorder.on_step(_figures(counters))
    assert metrics.cache_hit_tokens.value(tier="host") == 16
    assert metrics.cache_hit_tokens.value(tier="device") == 8
    assert metrics.promotion_seconds.count(from_tier="host") == 1


def test_a_step_moves_its_times_queue_sizes_and_the_cache_figures() -> None:
    metrics = EngineMetrics()
    counters = CacheCounters()
    counters.on_transfer(Tier.DEVICE, Tier.HOST, 4096)
    counters.on_eviction(Tier.HOST, 2, demoted=False)
    EngineRecorder(metrics).on_step(_figures(counters))
    assert metrics.step_seconds.value() == 0.5 and metrics.scheduler_seconds.value() == 0.1
    assert metrics.requests_running.value() == 1 and metrics.requests_waiting.value() == 2
    assert metrics.tier_used_bytes.value(tier="device") == 100
    assert metrics.tier_capacity_bytes.value(tier="host") == 0
    assert metrics.tier_cached_tokens.value(tier="host", layer_kind="full") == 32
    assert metrics.tier_cached_tokens.value(tier="host", layer_kind="sliding") == 16
    assert metrics.tier_cached_tokens.value(tier="device", layer_kind="sliding") == 48
    assert metrics.transfer_bytes.value(from_tier="device", to_tier="host") == 4096
    assert metrics.evicted_pages.value(tier="host", action="dropped") == 2
    assert metrics.remote_page_errors.value(reason="unavailable") == 3

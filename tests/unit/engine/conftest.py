"""A tiny engine on a tiny random model (fp32), a manual transfer executor and a fake clock:
every test decides when transfers finish and what time it is. Every engine test runs under
both cache write policies (write-through is the default, write-back demotes on eviction)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.model_factory import make_tiny_model_dir
from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import make_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import EngineConfig, SchedulePolicy, WritePolicy
from tieredkv.engine.engine import Engine
from tieredkv.engine.engine_recorder import EngineRecorder
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.protocol import GenerationRequest, RequestOutput
from tieredkv.engine.request import RequestStatus
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner
from tieredkv.model.sampler import SamplingParams

PAGE_SIZE = 4
MAX_MODEL_LEN = 256


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Harness:
    engine: Engine
    cache: TieredCache
    executor: ManualTransferExecutor
    clock: FakeClock
    metrics: EngineMetrics
    outputs: dict[str, list[RequestOutput]] = field(default_factory=lambda: defaultdict(list))
    auto_complete: bool = True  # finish every transfer right after each step

    def submit(
        self,
        request_id: str,
        prompt: Iterable[int],
        max_tokens: int = 8,
        sampling: SamplingParams | None = None,
        **kw,
    ) -> None:
        if sampling is None:
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        spec = GenerationRequest(
            request_id, tuple(prompt), sampling, arrival_time=self.clock(), **kw
        )
        self.engine.add_request(spec)

    def step(self) -> bool:
        progressed = self.engine.step()
        integrity = self.cache.check_integrity()
        assert integrity.ok, integrity.problems
        if self.auto_complete:
            self.executor.complete_all()
        return progressed

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            self.step()
            if not self.engine.has_work and not self.executor.pending():
                self.engine.step()  # apply the last transfers
                return
        queued = self.engine.scheduler.queued
        state = {
            "waiting": [(r.request_id, r.num_tokens) for r in queued(RequestStatus.WAITING)],
            "promoting": [r.request_id for r in queued(RequestStatus.PROMOTING)],
            "running": [
                (r.request_id, r.kv_len, len(r.page_table)) for r in queued(RequestStatus.RUNNING)
            ],
            "device_free": self.cache.device_pool.num_free,
            "host_free": self.cache.host_pool.num_free if self.cache.host_pool else None,
            "in_flight": len(self.cache.transfer_queue.in_flight),
            "pages": self.cache.check_integrity().page_counts,
        }
        raise AssertionError(f"requests still unfinished after {max_steps} steps: {state}")

    def finished(self, request_id: str) -> bool:
        return any(o.finished for o in self.outputs[request_id])

    def tokens(self, request_id: str) -> list[int]:
        return [t for o in self.outputs[request_id] for t in o.new_token_ids]

    def usage(self, request_id: str):
        return next(o.usage for o in self.outputs[request_id] if o.finished)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("engine-model"), init_std=0.5)
    return load_model(model_dir, dtype=torch.float32)


@pytest.fixture(params=list(WritePolicy), ids=lambda policy: policy.value)
def write_policy(request: pytest.FixtureRequest) -> WritePolicy:
    return request.param


@pytest.fixture
def make_harness(tiny_model: LoadedModel, tmp_path: Path, write_policy: WritePolicy):
    def build(
        device_pages: int = 256,
        host_pages: int = 0,
        disk_pages: int = 0,
        policy: SchedulePolicy = SchedulePolicy.LPM,
        max_num_seqs: int = 4,
        max_batch_tokens: int = 64,
        reuse: bool = True,
        max_queue: int = 256,
        split_host: bool = False,
        split_device: bool = False,
        split_disk: bool = False,
        attention_backend: str = "auto",
    ) -> Harness:
        layout = PageLayout.for_model(tiny_model.config, PAGE_SIZE, torch.float32)
        cache, executor = make_cache(
            layout,
            device_pages,
            host_pages,
            disk_pages,
            disk_dir=tmp_path / "disk",
            write_policy=write_policy,
            model=tiny_model.config,
            split_host=split_host,
            split_device=split_device,
            split_disk=split_disk,
        )
        runner = ModelRunner(
            tiny_model.config,
            tiny_model.weights,
            cache.device_pool,
            MAX_MODEL_LEN,
            attention_backend=attention_backend,
        )
        config = EngineConfig(
            max_model_len=MAX_MODEL_LEN,
            max_batch_tokens=max_batch_tokens,
            max_num_seqs=max_num_seqs,
            schedule_policy=policy,
            max_queue=max_queue,
        )
        clock = FakeClock()
        metrics = EngineMetrics()
        outputs: dict[str, list[RequestOutput]] = defaultdict(list)
        engine = Engine(
            runner,
            cache,
            tiny_model.tokenizer,
            config,
            sink=lambda output: outputs[output.request_id].append(output),
            recorder=EngineRecorder(metrics),
            reuse_prefixes=reuse,
            clock=clock,
        )
        return Harness(engine, cache, executor, clock, metrics, outputs)

    return build


def prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (length,), generator=generator).tolist()


def pushed_to_disk(make_harness, history: list[int], **options):
    """A harness whose only copy of `history` (bar a page or so) is on disk (`options`: the
    harness's, such as `split_disk`)."""
    harness = make_harness(device_pages=70, host_pages=8, disk_pages=256, **options)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(6):  # other conversations push it down through host to disk
        harness.submit(f"other{i}", prompt(60, seed=70 + i), max_tokens=2)
        harness.run()
    assert harness.cache.match(history, "").disk.num_pages > 0
    return harness

"""The engine: the step loop that joins the model runner, the scheduler and the tiered cache.

`step()` is the hot path: drain, apply transfers, schedule, forward, sample and emit, insert.
It runs on one thread, the only writer of the cache, the pools, the locks and the requests.
Other threads talk to it through `call_soon` (a queue of callables drained at the top of a step).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import EngineConfig
from tieredkv.engine.engine_metrics import EngineRecorder, StepFigures
from tieredkv.engine.output import OutputProcessor
from tieredkv.engine.protocol import FinishReason, GenerationRequest, RequestOutput
from tieredkv.engine.request import Request, RequestStatus
from tieredkv.engine.request_pages import RequestPages
from tieredkv.engine.scheduler import Scheduler, StepPlan
from tieredkv.model.runner import ModelRunner
from tieredkv.model.sampler import Sampler
from tieredkv.model.tokenizer import ChatTokenizer

logger = logging.getLogger(__name__)

OutputSink = Callable[[RequestOutput], None]


class Engine:
    """Continuous batching over the tiered cache. Engine thread only, except `call_soon`."""

    def __init__(
        self,
        runner: ModelRunner,
        cache: TieredCache,
        tokenizer: ChatTokenizer,
        config: EngineConfig,
        sink: OutputSink,
        recorder: EngineRecorder,
        reuse_prefixes: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert runner.pool is cache.device_pool, "the runner must use the cache's device pool"
        self.runner = runner
        self.cache = cache
        self.tokenizer = tokenizer
        self.config = config
        self.sink = sink
        self.recorder = recorder
        self.clock = clock
        self.pages = RequestPages(cache, runner.page_size, reuse_prefixes)
        self.scheduler = Scheduler(config, self.pages, recorder, runner.release, clock)
        self.sampler = Sampler()
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake = threading.Event()  # set by call_soon and by finished transfers
        cache.add_transfer_listener(self.wake.set)

    # --- the hot path ----------------------------------------------------------------------

    def step(self) -> bool:
        """One step; False when there was nothing to forward."""
        self._drain_inbox()
        started = time.perf_counter()
        self._end_aborted(self.scheduler.apply_transfers())
        plan = self.scheduler.schedule()
        scheduler_s = time.perf_counter() - started
        if plan.chunks:
            forward_started = self.clock()
            logits = self.runner.forward(plan.chunks)
            self._sample_and_emit(plan, logits, forward_started)
            inserting = time.perf_counter()
            self._insert_full_pages(plan.requests)
            scheduler_s += time.perf_counter() - inserting
        # the figures cover steps that forwarded something (an idle step's time is not work)
        step_s = time.perf_counter() - started if plan.chunks else 0.0
        scheduler_s = scheduler_s if plan.chunks else 0.0
        self.recorder.step_done(self._step_figures(step_s, scheduler_s))
        return bool(plan.chunks)

    def wait_for_work(self, timeout: float | None = None) -> None:
        """Block until a message or a finished transfer arrives (or `timeout`)."""
        # SYNC: the engine thread sleeps until another thread has something for it.
        self.wake.wait(timeout)
        self.wake.clear()

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # --- messages from other threads -------------------------------------------------------

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the engine thread at the top of the next step (thread-safe)."""
        self._inbox.put(fn)
        self.wake.set()

    def _drain_inbox(self) -> None:
        while True:
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return
            fn()

    def add_request(self, spec: GenerationRequest) -> None:
        """Queue a request (engine thread). QueueFullError past --max-queue."""
        output = OutputProcessor(
            self.tokenizer, spec.prompt_ids, spec.sampling, self.config.max_model_len
        )
        generator = self.sampler.new_generator(spec.sampling)
        kv = self.cache.new_handle(spec.namespace)
        request = Request(spec, next(self._seq_ids), output, generator, kv)
        self.scheduler.add(request)
        self.requests[spec.request_id] = request
        self.recorder.request_arrived(request)

    def abort(self, request_id: str) -> None:
        """Stop a request wherever it is (engine thread); its pages are freed."""
        request = self.requests.get(request_id)
        if request is None:
            return
        if request.status is RequestStatus.PROMOTING:
            request.finish_reason = FinishReason.ABORT  # ended when its promotion is done
            return
        self._finish(request, FinishReason.ABORT)

    # --- the steps -------------------------------------------------------------------------

    def _end_aborted(self, requests: list[Request]) -> None:
        for request in requests:
            self._finish(request, FinishReason.ABORT)

    def _sample_and_emit(self, plan: StepPlan, logits, forward_started: float) -> None:
        now = self.clock()
        rows, sampled = [], []
        for row, (request, chunk) in enumerate(zip(plan.requests, plan.chunks, strict=True)):
            request.kv_len = chunk.end
            if request.first_forward_at is None:  # queue_seconds ends where the forward began
                request.first_forward_at = forward_started
                self.recorder.first_forward(request)
            if request.num_pending == 0:
                rows.append(row)
                sampled.append(request)
        if not sampled:
            return
        tokens = self.sampler.sample_isolated(
            logits[rows],
            [r.spec.sampling for r in sampled],
            [r.generator for r in sampled],
            [r.output.banned_tokens() for r in sampled],
        )
        for request, token in zip(sampled, tokens, strict=True):
            if isinstance(token, Exception):
                logger.error("sampling failed for %s: %r", request.request_id, token)
                self._finish(request, FinishReason.ERROR, error=f"sampling failed: {token}")
            else:
                self._emit_token(request, token, now)

    def _emit_token(self, request: Request, token: int, now: float) -> None:
        request.output_ids.append(token)
        text, reason = request.output.append(token)
        self.recorder.token(request, now)
        if reason is None:
            self.sink(RequestOutput(request.request_id, (token,), text))
        else:
            self._finish(request, reason, (token,), text)

    def _insert_full_pages(self, requests: list[Request]) -> None:
        for request in requests:
            if request.status is RequestStatus.RUNNING:
                self.pages.insert_computed(request)

    def _step_figures(self, step_s: float, scheduler_s: float) -> StepFigures:
        cache, scheduler = self.cache, self.scheduler
        return StepFigures(
            step_seconds=step_s,
            scheduler_seconds=scheduler_s,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting) + len(scheduler.promoting),
            cache_counters=cache.counters,
            tier_used_bytes={tier: cache.tier_used_bytes(tier) for tier in Tier},
            tier_capacity_bytes={tier: cache.tier_capacity_bytes(tier) for tier in Tier},
            disk_page_errors=cache.disk_page_errors(),
            remote_page_errors=cache.remote_page_errors(),
        )

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        last_tokens: tuple[int, ...] = (),
        last_text: str = "",
        error: str | None = None,
    ) -> None:
        """End a request: its computed pages go to the tree (unless it failed), the rest is
        freed, its lock released, and one final output carries the usage."""
        self.scheduler.remove(request, keep_computed=reason is not FinishReason.ERROR)
        self.runner.release(request.seq_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.requests.pop(request.request_id, None)
        final = RequestOutput(
            request.request_id,
            last_tokens,
            last_text,
            finished=True,
            finish_reason=reason,
            usage=request.usage(),
            error=error,
        )
        self.sink(final)
        self.recorder.request_finished(request, reason, self.clock())

    def fail_all(self, message: str) -> None:
        """An unexpected error in a step: every request ends with `message` (generic: never
        an exception's text, which could carry another request's details), pages freed."""
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            logger.error("request %s failed: %s", request.request_id, message)
            self._finish(request, FinishReason.ERROR, error=message)

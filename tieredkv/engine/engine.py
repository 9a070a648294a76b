"""The engine: the step loop that joins the model runner and the tiered cache.

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
from dataclasses import dataclass, field

from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import EngineConfig
from tieredkv.engine.engine_metrics import EngineRecorder
from tieredkv.engine.output import OutputProcessor
from tieredkv.engine.protocol import FinishReason, GenerationRequest, QueueFullError, RequestOutput
from tieredkv.engine.request import Request, RequestStatus
from tieredkv.engine.request_pages import RequestPages
from tieredkv.engine.scheduler import QueueOrder, StepBudget
from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.runner import ModelRunner
from tieredkv.model.sampler import Sampler
from tieredkv.model.tokenizer import ChatTokenizer

logger = logging.getLogger(__name__)

OutputSink = Callable[[RequestOutput], None]


@dataclass
class StepPlan:
    """The chunks one step forwards, and the request behind each."""

    chunks: list[SequenceChunk] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def add(self, request: Request, count: int) -> None:
        start = request.kv_len
        tokens = request.token_slice(start, start + count)
        self.chunks.append(SequenceChunk(request.seq_id, tokens, start, request.page_table))
        self.requests.append(request)


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
        self.order = QueueOrder(config.schedule_policy)
        self.sampler = Sampler()
        self.waiting: list[Request] = []
        self.promoting: list[Request] = []
        self.running: list[Request] = []  # admission order: the oldest first
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake = threading.Event()  # set by call_soon and by finished transfers
        cache.add_transfer_listener(self.wake.set)

    # --- the hot path ----------------------------------------------------------------------

    def step(self) -> bool:
        """One step; False when there was nothing to forward."""
        self._drain_inbox()
        self._apply_transfers()
        plan = self._schedule()
        stale = [r.request_id for r in plan.requests if r.status is not RequestStatus.RUNNING]
        assert not stale, f"planned requests lost their pages before the forward: {stale}"
        if plan.chunks:
            forward_started = self.clock()
            logits = self.runner.forward(plan.chunks)
            self._sample_and_emit(plan, logits, forward_started)
            self._insert_full_pages(plan.requests)
        self.recorder.step_done(self)
        return bool(plan.chunks)

    def wait_for_work(self, timeout: float | None = None) -> None:
        """Block until a message or a finished transfer arrives (or `timeout`)."""
        # SYNC: the engine thread sleeps until another thread has something for it.
        self.wake.wait(timeout)
        self.wake.clear()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.promoting or self.running)

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
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(f"the queue holds {len(self.waiting)} requests (--max-queue)")
        output = OutputProcessor(
            self.tokenizer, spec.prompt_ids, spec.sampling, self.config.max_model_len
        )
        generator = self.sampler.new_generator(spec.sampling)
        kv = self.cache.new_handle(spec.namespace)
        request = Request(spec, next(self._seq_ids), output, generator, kv)
        self.requests[spec.request_id] = request
        self.pages.on_arrival(request)
        self.waiting.append(request)
        self.recorder.request_arrived(request)

    def abort(self, request_id: str) -> None:
        """Stop a request wherever it is (engine thread); its pages are freed."""
        request = self.requests.get(request_id)
        if request is None:
            return
        if request.status is RequestStatus.PROMOTING:
            request.finish_reason = FinishReason.ABORT  # finished when its promotion is
            return
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self._finish(request, FinishReason.ABORT)

    # --- the steps -------------------------------------------------------------------------

    def _apply_transfers(self) -> None:
        for request in self.pages.apply_transfers(self.promoting):
            self.promoting.remove(request)
            if request.finish_reason is FinishReason.ABORT:
                self._finish(request, FinishReason.ABORT)
                continue
            self._start_running(request)

    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.recorder.promotion_done(request)

    def _schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = StepBudget(self.config.max_batch_tokens, self.config.max_num_seqs)
        decodes = [r for r in self.running if r.num_pending == 1]
        prefills = [r for r in self.running if r.num_pending > 1]
        for request in decodes + prefills:
            self._plan_request(plan, budget, request)
        budget.seqs -= len(self.promoting)
        for request in self._admit(budget):
            self._plan_request(plan, budget, request)
        for request in self.waiting:
            self.pages.prefetch_while_waiting(request)
        return plan

    def _plan_request(self, plan: StepPlan, budget: StepBudget, request: Request) -> None:
        if request.status is not RequestStatus.RUNNING:
            return  # preempted earlier in this step
        count = budget.take(request)
        if count and self._reserve_pages(request, request.kv_len + count, plan):
            plan.add(request, count)

    def _reserve_pages(self, request: Request, end: int, plan: StepPlan) -> bool:
        """Device pages for tokens up to `end`, preempting the youngest running request that
        is not already in this step's plan (its pages are about to be written) if must be."""
        while not self.pages.grow(request, end):
            victim = next(
                (r for r in reversed(self.running) if r is not request and r not in plan.requests),
                None,
            )
            if victim is None or self.pages.transfers_in_flight():
                return False  # demotions in flight free pages soon, or nothing left to take
            self._preempt(victim)
        return True

    def _admit(self, budget: StepBudget) -> list[Request]:
        """Admit waiting requests in queue order while the step and the device have room."""
        started = []
        for request in self.order.ordered(self.waiting, self.clock()):
            if budget.seqs <= 0 or budget.tokens <= 0:
                break
            if not self.pages.admit(request):
                break  # no device room now; demotions started
            self.waiting.remove(request)
            request.admitted_at = request.admitted_at or self.clock()
            if request.kv.promotion_pending:
                request.status = RequestStatus.PROMOTING
                self.promoting.append(request)
                budget.seqs -= 1
            else:
                self.pages.take_promotion(request)
                self._start_running(request)
                started.append(request)
        return started

    def _preempt(self, request: Request) -> None:
        """Back to the queue; its computed pages go to the tree (demotable, not lost)."""
        logger.info("preempting %s at %d tokens", request.request_id, request.kv_len)
        self.running.remove(request)
        self.pages.release(request, keep_computed=True)
        self.runner.release(request.seq_id)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.pages.on_arrival(request)
        self.waiting.append(request)
        self.recorder.preempted()

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
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        self.pages.release(request, keep_computed=reason is not FinishReason.ERROR)
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
        """An unexpected error in a step: every request ends with an error, pages freed."""
        for request in [*self.running, *self.waiting]:
            if request in self.waiting:
                self.waiting.remove(request)
            logger.error("request %s failed: %s", request.request_id, message)
            self._finish(request, FinishReason.ERROR, error=message)

"""The engine: the step loop that joins the model runner, the scheduler and the tiered cache.

`step()` is the hot path: drain, apply transfers, schedule, forward, sample and emit, insert.
It runs on one thread, the only writer of the cache, the pools, the locks and the requests.
Other threads talk to it through `call_soon` (a queue of callables drained at the top of a step).

A request with `n` > 1 is prefilled once: the step that computes its prompt samples `n` first
tokens from the same logits (sequence `i` with its own generator, `seed + i`), and forks
sequences 1 .. n - 1 off it. A fork shares the prompt's full pages through the tree and gets a
copy of the partial last page; from then on it is a request of its own (`Request.index`). A
fork that would wait past `--max-queue` ends at once with `QUEUE_FULL`, as a new request is
refused; the other sequences go on. Logprobs come from the raw logits (`step_logprobs`): the
runner returns every prompt row's for a request that scores its prompt (echo).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.sliding_pages import tokens_by_layer_kind
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import EngineConfig
from tieredkv.engine.engine_recorder import EngineRecorder, StepFigures
from tieredkv.engine.output import OutputProcessor
from tieredkv.engine.protocol import (
    FinishReason,
    GenerationRequest,
    QueueFullError,
    RequestOutput,
    Usage,
)
from tieredkv.engine.request import Request, RequestStatus
from tieredkv.engine.request_pages import RequestPages
from tieredkv.engine.scheduler import Scheduler, StepPlan
from tieredkv.engine.sessions import SessionWarmth
from tieredkv.engine.step_logprobs import sampled_logprobs, score_prompt
from tieredkv.model.logprobs import TokenLogprob
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
        self.runner = runner
        self.cache = cache
        self.tokenizer = tokenizer
        self.config = config
        self.sink = sink
        self.recorder = recorder
        self.clock = clock
        self.pages = RequestPages(cache, runner.page_size, reuse_prefixes)
        self.scheduler = Scheduler(
            config, self.pages, recorder, runner.release, clock, runner.expect_prefix
        )
        self.sampler = Sampler()
        self.sessions = SessionWarmth(cache, config.session_think_time_s)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.wake = threading.Event()  # set by call_soon and by finished transfers
        cache.add_transfer_listener(self.wake.set)
        cache.add_device_landing_listener(runner.pages_landed)

    # --- the hot path ----------------------------------------------------------------------

    def step(self) -> bool:
        """One step; False when there was nothing to forward."""
        self._drain_inbox()
        self.sessions.expire(self.clock())
        self.cache.retention.expire(self.clock())
        started = time.perf_counter()
        self._end_aborted(self.scheduler.apply_transfers())
        plan = self.scheduler.schedule()
        scheduler_s = time.perf_counter() - started
        if plan.chunks:
            forward_started = self.clock()
            scored = [i for i, r in enumerate(plan.requests) if r.needs_prompt_logits]
            logits, row_logits = self.runner.forward_with_rows(plan.chunks, scored)
            for i, rows in row_logits.items():
                score_prompt(plan.requests[i], plan.chunks[i], rows)
            self._sample_and_emit(plan, logits, forward_started)
            self.recorder.on_prefill(
                sum(
                    max(0, min(chunk.end, len(request.spec.prompt_ids)) - chunk.start)
                    for request, chunk in zip(plan.requests, plan.chunks, strict=True)
                )
            )
            inserting = time.perf_counter()
            self._insert_full_pages(plan.requests)
            scheduler_s += time.perf_counter() - inserting
        # the figures cover steps that forwarded something (an idle step's time is not work)
        step_s = time.perf_counter() - started if plan.chunks else 0.0
        scheduler_s = scheduler_s if plan.chunks else 0.0
        self.recorder.on_step(self._step_figures(step_s, scheduler_s))
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
        kv = CacheHandle(self.cache, spec.namespace)
        request = Request(spec, next(self._seq_ids), output, generator, kv)
        request.unforked = spec.sampling.n - 1
        self.scheduler.add(request)
        self.requests[request.key] = request
        self.recorder.on_request_arrived(request)

    def abort(self, request_id: str) -> None:
        """Stop a request, every sequence of it, wherever it is (engine thread); its pages are
        freed. `request_id` may also name one sequence (`id/i`)."""
        keys = [k for k in self.requests if k == request_id or k.startswith(request_id + "/")]
        for key in keys:
            request = self.requests[key]
            if request.status is RequestStatus.PROMOTING:
                request.finish_reason = FinishReason.ABORT  # ended when its promotion is done
            else:
                self._finish(request, FinishReason.ABORT)

    # --- the steps -------------------------------------------------------------------------

    def _end_aborted(self, requests: list[Request]) -> None:
        for request in requests:
            self._finish(request, FinishReason.ABORT)

    def _sample_and_emit(self, plan: StepPlan, logits, forward_started: float) -> None:
        now = self.clock()
        rows: list[int] = []
        sampled: list[tuple[Request, int]] = []  # (request, fork): fork > 0 is a new sequence
        for row, (request, chunk) in enumerate(zip(plan.requests, plan.chunks, strict=True)):
            request.kv_len = chunk.end
            if request.first_forward_at is None:  # queue_seconds ends where the forward began
                request.first_forward_at = forward_started
                self.recorder.on_first_forward(request)
            if request.num_pending == 0:
                forks = range(request.index + 1, request.index + 1 + request.unforked)
                for fork in (0, *forks):
                    rows.append(row)
                    sampled.append((request, fork))
        if not sampled:
            return
        raw = logits[rows]
        generators = [
            r.generator if fork == 0 else self.sampler.new_generator(r.spec.sampling, fork)
            for r, fork in sampled
        ]
        tokens = self.sampler.sample_isolated(
            raw,
            [r.spec.sampling for r, _ in sampled],
            generators,
            [r.output.banned_tokens() for r, _ in sampled],
            [r.output_ids for r, _ in sampled],
        )
        logprobs = sampled_logprobs(raw, sampled, tokens)
        # forks first: each copies its parent's pages before the parent's token may end it
        order = sorted(range(len(sampled)), key=lambda i: sampled[i][1] == 0)
        for i in order:
            request, fork = sampled[i]
            if fork:
                request.unforked -= 1
                forked = self._fork(request, fork, generators[i])
                if forked is None:
                    continue  # refused: the queue is full
                request = forked
            token = tokens[i]
            if isinstance(token, Exception):
                logger.error("sampling failed for %s: %r", request.key, token)
                self._finish(request, FinishReason.ERROR, error=f"sampling failed: {token}")
            else:
                self._emit_token(request, token, now, logprobs[i])

    def _fork(self, parent: Request, index: int, generator) -> Request | None:
        """Sequence `index` of `parent`'s request, with the parent's prompt KV (shared and
        copied, not recomputed). With no device page free for it now, it waits in the queue
        with its first token and computes what it lacks when admitted; past --max-queue it
        ends at once, refused as a new request is (None), and the parent goes on."""
        spec = parent.spec
        output = OutputProcessor(
            self.tokenizer, spec.prompt_ids, spec.sampling, self.config.max_model_len
        )
        kv = CacheHandle(self.cache, spec.namespace)
        fork = Request(spec, next(self._seq_ids), output, generator, kv, index=index)
        fork.prompt_logprobs = parent.prompt_logprobs  # scored once, reported by each
        fork.admitted_at, fork.first_forward_at = parent.admitted_at, parent.first_forward_at
        fork.first_token_at = self.clock()  # the request's first token is timed once
        self.requests[fork.key] = fork
        try:
            self.scheduler.add_fork(parent, fork)
        except QueueFullError as error:
            self._finish(fork, FinishReason.QUEUE_FULL, error=str(error))
            return None
        return fork

    def _emit_token(
        self, request: Request, token: int, now: float, logprob: TokenLogprob | None = None
    ) -> None:
        first = not request.output_ids
        request.output_ids.append(token)
        text, reason = request.output.append(token)
        self.recorder.on_token(request, now)
        logprobs = () if logprob is None else (logprob,)
        prompt_logprobs = None
        if first and request.prompt_logprobs is not None:
            prompt_logprobs = tuple(request.prompt_logprobs)
        if reason is None:
            self.sink(
                RequestOutput(
                    request.request_id,
                    (token,),
                    text,
                    index=request.index,
                    logprobs=logprobs,
                    prompt_logprobs=prompt_logprobs,
                )
            )
        else:
            self._finish(
                request, reason, (token,), text, logprobs=logprobs, prompt_logprobs=prompt_logprobs
            )

    def _insert_full_pages(self, requests: list[Request]) -> None:
        for request in requests:
            if request.status is RequestStatus.RUNNING:
                self.pages.insert_computed(request)

    def _step_figures(self, step_s: float, scheduler_s: float) -> StepFigures:
        cache, model, queues = self.cache, self.runner.config, self.scheduler.queue_sizes()
        return StepFigures(
            step_seconds=step_s,
            scheduler_seconds=scheduler_s,
            num_running=queues.running,
            num_waiting=queues.waiting + queues.promoting,
            cache_counters=cache.counters,
            tier_used_bytes={tier: cache.tier_used_bytes(tier) for tier in Tier},
            tier_capacity_bytes={tier: cache.tier_capacity_bytes(tier) for tier in Tier},
            tier_cached_tokens=tokens_by_layer_kind(model, cache.page_size, cache.tier_parts_held),
            disk_page_errors=cache.disk_page_errors(),
            remote_page_errors=cache.remote_page_errors(),
            retention=cache.retention.figures(self.clock()),
        )

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        last_tokens: tuple[int, ...] = (),
        last_text: str = "",
        error: str | None = None,
        logprobs: tuple[TokenLogprob, ...] = (),
        prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None,
    ) -> None:
        """End a sequence: its computed pages go to the tree (unless it failed), the rest is
        freed, its lock released, and one final output carries the usage. Sequences never
        forked off it (it ended before its first token) end with it, for the same reason."""
        kept = reason is not FinishReason.ERROR
        warm = kept and request.spec.session is not None and self.sessions.enabled
        hold = self.scheduler.remove(request, keep_computed=kept, keep_warm=warm)
        if hold is not None:
            session = f"{request.spec.namespace}\0{request.spec.session}"  # per namespace
            self.sessions.keep(session, hold, self.clock())
        if kept and (spec := request.spec).retain:
            self.cache.retention.retain(spec.prompt_ids, spec.namespace, self.clock())
        self.runner.release(request.seq_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.requests.pop(request.key, None)
        final = RequestOutput(
            request.request_id,
            last_tokens,
            last_text,
            finished=True,
            finish_reason=reason,
            usage=request.usage(),
            error=error,
            index=request.index,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
        self.sink(final)
        for index in range(request.index + 1, request.index + 1 + request.unforked):
            self.sink(
                RequestOutput(
                    request.request_id,
                    finished=True,
                    finish_reason=reason,
                    error=error,
                    index=index,
                    usage=Usage(0, 0, 0),
                )
            )
        request.unforked = 0
        if request.index == 0:  # a request counts once; every sequence's tokens count
            self.recorder.on_request_finished(request, reason, self.clock())

    def fail_all(self, message: str) -> None:
        """An unexpected error in a step: every request ends with `message` (generic: never
        an exception's text, which could carry another request's details), pages freed."""
        for request in self.scheduler.drain():
            logger.error("request %s failed: %s", request.request_id, message)
            self._finish(request, FinishReason.ERROR, error=message)

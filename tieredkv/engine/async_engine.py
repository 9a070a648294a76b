"""The engine on its own thread, seen from the server's event loop (`EngineClient`).

The step thread owns the engine. Requests, aborts, flushes and integrity checks go in through
`Engine.call_soon`; each request's outputs come back through an asyncio queue fed with
`call_soon_threadsafe`. The step thread is the only one that touches the tree: it also closes
the cache when it ends, after a shutdown or when it dies.

If the step thread dies (an exception outside a step's own recovery), every waiting stream
fails at once with a generic error, `/health` turns 503 (`"engine": "dead"`), and the server
exits non-zero once drained (see `server.runner`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from tieredkv.cache.build import build_cache
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_listener import PageListener
from tieredkv.cache.pins import PinError
from tieredkv.cache.sliding_pages import held_by_layer_kind
from tieredkv.cache.tier import Tier
from tieredkv.config import CacheConfig, EngineConfig
from tieredkv.engine.capacity import capacity_lines, capacity_summary
from tieredkv.engine.engine import Engine
from tieredkv.engine.engine_recorder import EngineRecorder
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.output_streams import OutputStreams
from tieredkv.engine.protocol import (
    EngineClient,
    EngineUnavailableError,
    FinishReason,
    GenerationRequest,
    QueueFullError,
    RequestOutput,
)
from tieredkv.engine.request import RequestStatus
from tieredkv.engine.stats_line import StatsLine
from tieredkv.engine.warmup import check_device_capacity, warm_up
from tieredkv.model.fingerprint import model_fingerprint
from tieredkv.model.loader import LoadedModel
from tieredkv.model.runner import ModelRunner
from tieredkv.model.sampler import SamplingParams
from tieredkv.model.workspace_attention import WorkspaceAttention
from tieredkv.model.workspace_budget import carve_workspace

logger = logging.getLogger(__name__)

# While requests wait on something no wake-up signals (pages that only a finishing request
# will free), the step thread re-checks this often.
_STALLED_RECHECK_SECONDS = 0.05
PIN_ATTEMPTS = 3  # a pin's prompt is computed again if its pages left before the pin
FLUSH_SETTLE_S = 5.0  # POST /v1/cache/flush waits this long at most for transfers in flight


class AsyncEngine(EngineClient):
    def __init__(self, engine: Engine, metrics: EngineMetrics, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.config.max_model_len
        self._streams = OutputStreams()
        self._stopping = False
        self._ready = False
        self._dead = False
        self._closed = threading.Event()  # the step thread closed the cache and the runner
        self._thread = threading.Thread(target=self._run, name="tkv-engine", daemon=True)
        self.capacity: dict = {}  # what each tier holds, and the memory to expect (`start`)

    @classmethod
    def start(
        cls,
        loaded: LoadedModel,
        cache_config: CacheConfig,
        engine_config: EngineConfig,
        metrics: EngineMetrics,
        *,
        device: torch.device | str = "cpu",
        clock: Callable[[], float] = time.monotonic,
        page_listener: PageListener | None = None,
    ) -> AsyncEngine:
        """Build the cache (rebuilding the disk index; `page_listener` hears of its pages),
        the runner and the engine, warm the model up and start the step thread."""
        dtype = loaded.weights["model.embed_tokens.weight"].dtype
        layout = PageLayout.for_model(loaded.config, cache_config.page_size, dtype)
        in_ram = torch.device(device).type == "cpu"
        cache_config, workspace_bytes = carve_workspace(cache_config, engine_config, layout, in_ram)
        check_device_capacity(cache_config, layout, engine_config.max_model_len)
        cache = build_cache(
            cache_config, layout, model_fingerprint(loaded, layout), device, clock=clock,
            page_listener=page_listener, model=loaded.config,
        )  # fmt: skip
        runner = ModelRunner(
            loaded.config,
            loaded.weights,
            cache.device_pool,
            engine_config.max_model_len,
            max_seqs=engine_config.max_num_seqs,
            workspace_bytes=workspace_bytes if in_ram else None,
        )
        warm_up(runner, cache)
        weights_bytes = sum(t.numel() * t.element_size() for t in loaded.weights.values())
        capacity = capacity_summary(cache, weights_bytes, workspace_bytes, in_ram)
        for line in capacity_lines(capacity, layout.token_bytes):
            logger.info("%s", line)
        client: AsyncEngine
        engine = Engine(
            runner,
            cache,
            loaded.tokenizer,
            engine_config,
            sink=lambda output: client._streams.deliver(output.request_id, output),
            recorder=EngineRecorder(metrics),
            reuse_prefixes=cache_config.enable_prefix_reuse,
            clock=clock,
        )
        client = cls(engine, metrics, clock)
        client.capacity = capacity
        client._thread.start()
        client._ready = True
        return client

    # --- the step thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._step_until_stopped()
        except BaseException:
            logger.critical("the engine thread died; failing every request", exc_info=True)
            self._dead = True
            self._streams.fail_all(EngineUnavailableError("the engine stopped"))
        finally:
            self._close_on_this_thread()

    def _step_until_stopped(self) -> None:
        engine = self.engine
        stats = StatsLine(self.metrics)
        while not (self._stopping and not engine.has_work):
            if stats.due() and (line := stats.take()) is not None:
                logger.info("%s", line)
            try:
                progressed = engine.step()
            except Exception:  # a bug: fail the step's requests (never with its text), go on
                logger.exception("engine step failed")
                engine.fail_all("internal error")
                continue
            if not progressed:
                if not engine.has_work and engine.cache.prefault_some():
                    continue  # idle: one chunk of the host tier faulted in, then look again
                engine.wait_for_work(_STALLED_RECHECK_SECONDS if engine.has_work else None)

    def _close_on_this_thread(self) -> None:
        """Let transfers in flight finish, close the disk store (it reopens cleanly) and the
        runner. Stuck I/O blocks only this thread: `shutdown` does not wait past its bound."""
        try:
            self.engine.cache.close()
            self.engine.runner.close()
        except BaseException:
            logger.exception("closing the cache failed")
        finally:
            self._closed.set()

    # --- EngineClient ----------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        if not self._ready or self._stopping or self._dead:
            raise EngineUnavailableError("the engine is not accepting requests")
        if self.engine.scheduler.queue_full:
            raise QueueFullError(f"the queue is full ({self.engine.config.max_queue} requests)")
        if not request.arrival_time:
            request = dataclasses.replace(request, arrival_time=self.clock())
        stream = self._streams.open(request.request_id)
        self.engine.call_soon(lambda: self._add(request))
        if self._dead:  # died between the check and the registration: nobody would answer
            stream.put_nowait(EngineUnavailableError("the engine stopped"))
        finished = False
        sequences_left = request.sampling.n  # each of the n sequences ends with its own update
        try:
            while not finished:
                output = await stream.get()
                if isinstance(output, Exception):  # refused before the first update
                    finished = True
                    raise output
                sequences_left -= output.finished
                finished = sequences_left == 0
                yield output
        finally:
            self._streams.close(request.request_id)
            if not finished:  # the client hung up: free its pages
                self.engine.call_soon(lambda: self.engine.abort(request.request_id))

    def _add(self, request: GenerationRequest) -> None:
        try:
            self.engine.add_request(request)
        except QueueFullError as error:  # the queue filled between the check and now
            self._streams.deliver(request.request_id, error)

    async def abort(self, request_id: str) -> None:
        self.engine.call_soon(lambda: self.engine.abort(request_id))

    async def _on_engine_thread(self, fn: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as error:
                future.set_exception(error)

        self.engine.call_soon(run)
        return await asyncio.wrap_future(future)

    async def flush_cache(self, tenant: str | None = None) -> int:
        """Drop every unlocked cached page (or `tenant`'s), forget the rest (`TieredCache.flush`),
        after letting transfers in flight finish (at most `FLUSH_SETTLE_S`): the cache cannot
        drop a page being copied, nor leave out pages a request just wrote through."""

        def settle_then_flush() -> int:
            cache = self.engine.cache
            deadline = time.monotonic() + FLUSH_SETTLE_S
            while cache.transfers_in_flight() and time.monotonic() < deadline:
                cache.wait(deadline - time.monotonic())  # write-through may start a next hop
            return cache.flush(tenant=tenant)

        return await self._on_engine_thread(settle_then_flush)

    async def pin(self, namespace: str, prompt_ids: tuple[int, ...]) -> dict:
        """Compute the prompt (a one-token greedy request: its pages go into the tree, from
        the cache where they are there already) and pin its full pages. Tried again when they
        left the device and host between the two (a busy server)."""
        cache = self.engine.cache
        for _ in range(PIN_ATTEMPTS):
            sampling = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            request = GenerationRequest(f"pin-{uuid.uuid4().hex}", prompt_ids, sampling, namespace)
            last = None
            async for output in self.generate(request):
                last = output
            if last is None or last.finish_reason in (FinishReason.ABORT, FinishReason.ERROR):
                raise EngineUnavailableError("the engine did not compute the prompt to pin")
            pin = await self._on_engine_thread(lambda: cache.pin(prompt_ids, namespace))
            if pin is not None:
                return {
                    "pinned_tokens": pin.num_pages * cache.page_size,
                    "pinned_pages": pin.num_pages,
                    **cache.pins.usage(namespace),
                }
        raise PinError("the prompt's pages left the cache before they could be pinned", "prompt")

    async def unpin(self, namespace: str, prompt_ids: tuple[int, ...]) -> bool:
        return await self._on_engine_thread(lambda: self.engine.cache.unpin(prompt_ids, namespace))

    async def list_pins(self) -> dict:
        return await self._on_engine_thread(self.engine.cache.pins.describe)

    def pins_to_restore(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(pin.namespace, pin.token_ids) for pin in self.engine.cache.pins.waiting()]

    async def debug_cache(self) -> dict:
        def inspect() -> dict:
            result = self.engine.cache.check_integrity()
            return {
                "ok": result.ok,
                "problems": list(result.problems),
                "pages": result.page_counts,
                "locked_nodes": self.engine.cache.num_locks(),
                "pins": len(self.engine.cache.pins) - len(self.engine.cache.pins.waiting()),
                "pins_waiting": len(self.engine.cache.pins.waiting()),
                "namespaces": self.engine.cache.namespace_pages(),
                "remote_store": self.engine.cache.remote_store_state(),
                "requests": dataclasses.asdict(self.engine.scheduler.queue_sizes()),
            }

        return await self._on_engine_thread(inspect)

    def health(self) -> dict:
        cache = self.engine.cache
        tiers = {tier.label: "disabled" for tier in Tier}
        for tier in filter(cache.tier_enabled, Tier):
            tiers[tier.label] = "healthy" if cache.tier_healthy(tier) else "degraded"
        # the capacity in effect: a disk store that could not be preallocated starts smaller
        capacity = {tier.label: cache.tier_capacity_bytes(tier) for tier in Tier}
        held = cache.tier_parts_held
        ready = self._ready and not self._stopping and not self._dead
        state = "dead" if self._dead else "stopping" if self._stopping else "running"
        return {
            "ready": ready,
            "engine": state,
            "tiers": tiers,
            "tier_capacity_bytes": capacity,
            "direct_io": cache.disk_direct_io(),  # None: no disk tier
            "capacity": self.capacity,
            "workspace": self._workspace_usage(),
            "layer_kinds": held_by_layer_kind(self.engine.runner.config, cache.layout, held),
        }

    def _workspace_usage(self) -> dict | None:
        """The attention workspaces' memory (None: an attention path without them)."""
        attention = self.engine.runner.attention
        if not isinstance(attention, WorkspaceAttention):
            return None
        return attention.workspace_usage()

    def render_metrics(self) -> str:
        return self.metrics.render()

    async def shutdown(self, timeout: float = 8.0) -> None:
        """Stop accepting; give running requests part of `timeout` to finish, then abort the
        rest; the step thread then lets transfers in flight complete and closes the disk store
        cleanly. Returns within `timeout` even if I/O is stuck (`closed` says whether the
        cache was closed)."""
        self._stopping = True
        engine = self.engine

        def abort_waiting() -> None:
            for request in engine.scheduler.queued(RequestStatus.WAITING):
                engine.abort(request.request_id)

        def abort_all() -> None:
            for request_id in list(engine.requests):
                engine.abort(request_id)

        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        engine.call_soon(abort_waiting)
        # the step thread exits once the running requests are done, and closes the cache
        await loop.run_in_executor(None, self._closed.wait, timeout / 2)
        if not self._closed.is_set():
            engine.call_soon(abort_all)
            remaining = max(deadline - time.monotonic(), 0.0)
            await loop.run_in_executor(None, self._closed.wait, remaining)
        if not self._closed.is_set():
            logger.error("the engine did not close the cache within %.0f s", timeout)

    @property
    def closed(self) -> bool:
        """The step thread has ended and closed the cache and the runner."""
        return self._closed.is_set()

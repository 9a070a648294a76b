"""Who runs next, with which pages: the queues, admission, promotion waits, each step's device
pages and preemption (engine thread only).

Queues: `waiting` (arrived, preempted, or forked with no device page free; `--max-queue` caps
it), `promoting` (admitted; host and disk pages on their way to the device), `running` (in
admission order, the oldest first). Only the scheduler touches them; the engine adds, forks,
removes and drains requests through its methods.

Each step: running decodes first (one token each, oldest first, round-robin over owners:
`owner_shares`); then admission, while the budget has tokens left after the decodes; then
prefill chunks of the running requests, the newly admitted among them, in
`QueueOrder.prefill_order` (under `lpm` the fewest tokens left first, aged), until
`max_batch_tokens` tokens or `max_num_seqs` sequences (a request still promoting holds a
sequence). A request is planned only once its device pages for the step are reserved; when none
are free, the youngest running request not already in the plan (whose pages are about to be
written) of the owner holding the most running sequences is preempted: its computed pages go
into the tree, where they are demoted, not lost, and it waits again. Nothing is preempted while
transfers are in flight: the demotions among them free pages soon.

Admission order is `QueueOrder`'s (`queue_order`: arrival, or cache-aware with aging), after
the requests owed a seat (`owner_shares`: owners below their share while one is above). Before
each admission the waiting requests are matched again, `REMATCH_MAX_WAITING` at most, in turn (a
match costs ~10 µs; the engine reports the time it spends here as `scheduler_seconds_total`).
Admission stops at the first request the device has no room for, its whole prompt counted
(`admission.DeviceRoom`); under `lpm` a request that shares a prefix with one still computing
it waits for that prefill (`admission.prefix_being_computed`) and is passed over meanwhile, its
place kept: the requests after it are admitted only into the sequences and device room left
once its own are counted (a sequence, the pages of its prompt beyond the shared prefix), so
when the prefix is in the tree it is not left behind those admitted in its place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tieredkv.cache.cache_handle import WarmHold
from tieredkv.config import EngineConfig, SchedulePolicy
from tieredkv.engine.admission import DeviceRoom, prefix_being_computed, shared_prompt_tokens
from tieredkv.engine.engine_recorder import EngineRecorder
from tieredkv.engine.owner_shares import SeatShares, preemption_victim, round_robin
from tieredkv.engine.protocol import FinishReason, QueueFullError
from tieredkv.engine.queue_order import QueueOrder
from tieredkv.engine.request import Request, RequestStatus
from tieredkv.engine.request_pages import RequestPages
from tieredkv.model.forward_batch import SequenceChunk

logger = logging.getLogger(__name__)

REMATCH_MAX_WAITING = 64  # re-matched per admission, in turn: ~0.7 ms at most


@dataclass
class StepBudget:
    """Tokens and sequences left in this step."""

    tokens: int
    seqs: int

    def take(self, request: Request) -> int:
        """Tokens `request` forwards this step (0: none fit)."""
        if self.seqs <= 0 or self.tokens <= 0:
            return 0
        count = min(request.num_pending, self.tokens)
        self.tokens -= count
        self.seqs -= 1
        return count


@dataclass(frozen=True)
class QueueSizes:
    """The queues' lengths now (the step's figures, `GET /debug/cache`)."""

    waiting: int
    promoting: int
    running: int


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


class Scheduler:
    """The queues and each step's plan. `release_sequence(seq_id)` frees a preempted
    sequence's state outside the cache (the model runner's workspace); `expect_prefix(seq_id,
    pages)`, if given, hears which device pages an admitted request's promotion fills."""

    def __init__(
        self,
        config: EngineConfig,
        pages: RequestPages,
        recorder: EngineRecorder,
        release_sequence: Callable[[int], None],
        clock: Callable[[], float],
        expect_prefix: Callable[[int, Sequence[int | None]], None] | None = None,
    ) -> None:
        self.config = config
        self.pages = pages
        self.recorder = recorder
        self.release_sequence = release_sequence
        self.expect_prefix = expect_prefix
        self.clock = clock
        self.order = QueueOrder(config.schedule_policy)
        self.page_size = pages.page_size
        self._rematch_cursor = 0
        self._waiting: list[Request] = []
        self._promoting: list[Request] = []
        self._running: list[Request] = []  # admission order: the oldest first

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._promoting or self._running)

    @property
    def queue_full(self) -> bool:
        """The waiting queue holds --max-queue requests: a new one is refused."""
        return len(self._waiting) >= self.config.max_queue

    def queue_sizes(self) -> QueueSizes:
        return QueueSizes(len(self._waiting), len(self._promoting), len(self._running))

    def queued(self, status: RequestStatus) -> tuple[Request, ...]:
        """The requests in the queue of `status` (WAITING, PROMOTING or RUNNING), in order."""
        queues = {
            RequestStatus.WAITING: self._waiting,
            RequestStatus.PROMOTING: self._promoting,
            RequestStatus.RUNNING: self._running,
        }
        return tuple(queues[status])

    def add(self, request: Request) -> None:
        """Queue a new request. QueueFullError past --max-queue."""
        if self.queue_full:
            raise QueueFullError(f"the queue holds {len(self._waiting)} requests (--max-queue)")
        self.pages.on_arrival(request)
        self._waiting.append(request)

    def add_fork(self, parent: Request, fork: Request) -> None:
        """Queue a sequence forked off `parent` as it samples its first token: running at once
        when it can share the parent's prompt pages now, else waiting (it computes what it
        lacks when admitted). QueueFullError past --max-queue, as for a new request; the fork
        then holds nothing."""
        if self.pages.share_prompt(parent, fork):
            fork.status = RequestStatus.RUNNING
            self._running.append(fork)
        else:
            self.add(fork)

    def drain(self) -> list[Request]:
        """Take every running and waiting request out of its queue, for the engine to end
        (an unexpected error in a step). Promoting requests stay: their transfers in flight
        hold their pages until applied."""
        drained = [*self._running, *self._waiting]
        self._running, self._waiting = [], []
        return drained

    def remove(
        self, request: Request, keep_computed: bool, keep_warm: bool = False
    ) -> WarmHold | None:
        """Take an ending request out of its queue and free its pages (its computed pages go
        into the tree first when `keep_computed`). Not while its promotion is in flight.
        With `keep_warm`, returns the hold that keeps its tree pages on host."""
        for queue in (self._waiting, self._running):
            if request in queue:
                queue.remove(request)
        return self.pages.release(request, keep_computed, keep_warm)

    def apply_transfers(self) -> list[Request]:
        """Apply finished transfers: requests whose promotion is done start running. Returns
        those aborted while promoting, out of every queue, for the engine to end."""
        aborted = []
        for request in self.pages.apply_transfers(self._promoting):
            self._promoting.remove(request)
            if request.finish_reason is FinishReason.ABORT:
                aborted.append(request)
            else:
                self._start_running(request)
        return aborted

    def schedule(self) -> StepPlan:
        """This step's chunks: decodes, then the prefills of running and newly admitted
        requests; queued requests start prefetching their disk pages."""
        plan = StepPlan()
        budget = StepBudget(self.config.max_batch_tokens, self.config.max_num_seqs)
        held = [*self._running, *self._promoting]
        shares = SeatShares(held, self._waiting, self.config.max_num_seqs)
        owed = shares.owed(self._waiting)
        decodes = round_robin(r for r in self._running if r.num_pending == 1)
        budget.seqs -= len(owed)  # held back for the requests owed a seat
        for request in decodes:
            self._plan_request(plan, budget, request)
        budget.seqs += len(owed) - len(self._promoting)
        self._admit(budget, plan, shares, owed)
        decoding = set(map(id, decodes))  # those admitted now may have one token left too
        prefilling = [r for r in self._running if r.num_pending and id(r) not in decoding]
        for request in self.order.prefill_order(prefilling, self.clock()):
            self._plan_request(plan, budget, request)
        for request in self._waiting:
            self.pages.prefetch_while_waiting(request)
        stale = [r.request_id for r in plan.requests if r.status is not RequestStatus.RUNNING]
        assert not stale, f"planned requests lost their pages before the forward: {stale}"
        return plan

    def _plan_request(self, plan: StepPlan, budget: StepBudget, request: Request) -> None:
        if request.status is not RequestStatus.RUNNING:
            return  # preempted earlier in this step
        count = budget.take(request)
        if count and self._reserve_pages(request, request.kv_len + count, plan):
            plan.add(request, count)

    def _reserve_pages(self, request: Request, end: int, plan: StepPlan) -> bool:
        """Device pages for tokens up to `end`, preempting if must be the youngest running
        request, not already in this step's plan, of the owner holding the most."""
        while not self.pages.grow(request, end):
            victim = preemption_victim(self._running, [request, *plan.requests])
            if victim is None or self.pages.transfers_in_flight():
                return False  # demotions in flight free pages soon, or nothing left to take
            self._preempt(victim)
        return True

    def _admit(
        self, budget: StepBudget, plan: StepPlan, shares: SeatShares, owed: list[Request]
    ) -> None:
        """Admit waiting requests, those owed a seat first, then in queue order, while the
        step and the device have room: those whose pages are ready start running, the others
        wait in `promoting`."""
        now = self.clock()
        self._rematch_waiting()
        room = self._device_room()
        kept = 0  # sequences kept for requests waiting for a prefix being computed
        owed_ids = {id(request) for request in owed}
        ordered = self.order.ordered(self._waiting, now)
        ordered.sort(key=lambda request: id(request) not in owed_ids)  # stable: owed first
        for request in ordered:
            if budget.seqs <= 0 or budget.tokens <= 0:
                break
            is_owed = id(request) in owed_ids
            seats_held = len(self._running) + len(self._promoting) + kept
            if seats_held >= self.config.max_num_seqs and not is_owed:
                break  # --max-num-seqs caps the sequences held, not only those forwarded
            source = self._waits_for_shared_prefix(request, now)
            if source is not None:  # passed over, its place kept: a sequence, its own pages
                if not room.keep(request, shared_prompt_tokens(request, source, self.page_size)):
                    break
                kept += 1
                continue
            fits = not (self._running or self._promoting) or room.fits(request)
            if not fits and not (is_owed and self._preempt_for(request, room, plan, shares)):
                break  # its prompt does not fit beside the admitted ones: they finish first
            if not self.pages.admit(request):
                break  # no device room now; demotions started
            room.take(request)
            shares.take(request)
            self._waiting.remove(request)
            request.admitted_at = request.admitted_at or now
            if request.kv.promotion_pending:
                request.status = RequestStatus.PROMOTING
                self._promoting.append(request)
                if self.expect_prefix is not None:
                    self.expect_prefix(request.seq_id, request.kv.planned_pages)
                budget.seqs -= 1
            else:
                self.pages.take_promotion(request)
                self._start_running(request)

    def _device_room(self) -> DeviceRoom:
        held, pages = self.pages.held_pages, self.pages.device_pages
        return DeviceRoom(pages, self._running, self._promoting, self.page_size, held)

    def _preempt_for(
        self, request: Request, room: DeviceRoom, plan: StepPlan, shares: SeatShares
    ) -> bool:
        """Preempt sequences of the owners above their share, not in this step's plan, until
        `request`'s prompt fits in `room`; False when it cannot be made to fit now."""
        while not room.fits(request):
            above = shares.above_share(self._running)
            victim = preemption_victim(above, plan.requests)
            if victim is None or self.pages.transfers_in_flight():
                return False
            free_before = self._device_room().free_pages
            self._preempt(victim)
            shares.release(victim)
            room.free_pages += self._device_room().free_pages - free_before
        return True

    def _rematch_waiting(self) -> None:
        """lpm: match waiting requests against the tree as it is now, at most
        `REMATCH_MAX_WAITING` per admission, in turn (each priority is then at most
        ceil(waiting / 64) admissions old)."""
        if self.order.policy is not SchedulePolicy.LPM:
            return
        waiting = self._waiting
        if len(waiting) > REMATCH_MAX_WAITING:
            start = self._rematch_cursor % len(waiting)
            waiting = (waiting[start:] + waiting[:start])[:REMATCH_MAX_WAITING]
            self._rematch_cursor = start + REMATCH_MAX_WAITING
        for request in waiting:
            self.pages.on_arrival(request)

    def _waits_for_shared_prefix(self, request: Request, now: float) -> Request | None:
        """lpm: the admitted request computing a prefix `request` shares beyond its cached
        match, which `request` waits for; None: it waits for nobody. No time bound: the wait
        ends with that prefill, which the prefill order's aging bounds, or when that request
        leaves the batch (preempted, ended)."""
        if self.order.policy is not SchedulePolicy.LPM or not self.pages.reuse:
            return None
        was_waiting = request.deferred_at is not None
        if was_waiting:
            request.deferred_s += now - request.deferred_at
            request.deferred_at = None
        admitted = [*self._running, *self._promoting]
        source = prefix_being_computed(request, admitted, self.page_size)
        if source is None:
            return None
        if not was_waiting and request.deferred_s == 0.0:
            self.recorder.on_deferred_admission()  # its first such wait
        request.deferred_at = now
        return source

    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self._running.append(request)
        self.recorder.on_promotion_done(request)

    def _preempt(self, request: Request) -> None:
        """Back to the queue; its computed pages go to the tree (demotable, not lost)."""
        logger.info("preempting %s at %d tokens", request.request_id, request.kv_len)
        self._running.remove(request)
        self.pages.release(request, keep_computed=True)
        self.release_sequence(request.seq_id)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.pages.on_arrival(request)
        self._waiting.append(request)
        self.recorder.on_preemption()

"""The scheduler on its own: admission, promotion waits, page reservation and preemption over a
real tiered cache (manual transfers, page size 4), with no model: a test "forwards" a plan by
doing what the engine does around the forward. check_integrity() runs after every forward."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.support.manual_executor import ManualTransferExecutor
from tests.support.tiny_cache import make_cache, tiny_layout
from tests.unit.engine.conftest import FakeClock
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import EngineConfig, SchedulePolicy, WritePolicy
from tieredkv.engine.engine_recorder import EngineRecorder
from tieredkv.engine.metrics import EngineMetrics
from tieredkv.engine.protocol import FinishReason, GenerationRequest
from tieredkv.engine.queue_order import QueueOrder
from tieredkv.engine.request import Request, RequestStatus
from tieredkv.engine.request_pages import RequestPages
from tieredkv.engine.scheduler import Scheduler, StepPlan
from tieredkv.model.sampler import SamplingParams

PAGE_SIZE = 4
SAMPLED = 7  # the token every sampling "produces"


@dataclass
class Rig:
    scheduler: Scheduler
    pages: RequestPages
    cache: TieredCache
    executor: ManualTransferExecutor
    metrics: EngineMetrics
    clock: FakeClock
    released: list[int]  # seq ids of preempted requests, given back to the "runner"
    seq_ids: Iterator[int] = field(default_factory=itertools.count)

    def request(self, request_id: str, prompt: list[int], namespace: str = "") -> Request:
        self.clock.advance(0.001)  # arrivals in call order
        sampling = SamplingParams(max_tokens=64)
        spec = GenerationRequest(
            request_id, tuple(prompt), sampling, namespace=namespace, arrival_time=self.clock()
        )
        kv = CacheHandle(self.cache, namespace)
        request = Request(spec, next(self.seq_ids), None, None, kv)  # type: ignore[arg-type]
        self.scheduler.add(request)
        return request

    def waiting(self) -> list[Request]:
        return list(self.scheduler.queued(RequestStatus.WAITING))

    def running(self) -> list[Request]:
        return list(self.scheduler.queued(RequestStatus.RUNNING))

    def step(self) -> StepPlan:
        """Apply transfers, schedule, and 'forward' the plan as the engine would."""
        assert self.scheduler.apply_transfers() == []
        plan = self.scheduler.schedule()
        for request, chunk in zip(plan.requests, plan.chunks, strict=True):
            assert len(request.page_table) * PAGE_SIZE >= chunk.end  # its pages are reserved
            request.kv_len = chunk.end
            if request.num_pending == 0:
                request.output_ids.append(SAMPLED)
            self.pages.insert_computed(request)
        result = self.cache.check_integrity()
        assert result.ok, result.problems
        return plan

    def finish(self, request: Request) -> None:
        self.scheduler.remove(request, keep_computed=True)
        request.status = RequestStatus.FINISHED


def make_rig(
    device_pages: int = 32,
    host_pages: int = 0,
    max_num_seqs: int = 4,
    max_batch_tokens: int = 64,
    policy: SchedulePolicy = SchedulePolicy.LPM,
    write_policy: WritePolicy = WritePolicy.WRITE_BACK,
) -> Rig:
    cache, executor = make_cache(
        tiny_layout(PAGE_SIZE), device_pages, host_pages, write_policy=write_policy
    )
    config = EngineConfig(
        max_model_len=64,
        max_batch_tokens=max_batch_tokens,
        max_num_seqs=max_num_seqs,
        schedule_policy=policy,
    )
    metrics, clock, released = EngineMetrics(), FakeClock(), []
    pages = RequestPages(cache, PAGE_SIZE, reuse_prefixes=True)
    recorder = EngineRecorder(metrics)
    scheduler = Scheduler(config, pages, recorder, released.append, clock)
    return Rig(scheduler, pages, cache, executor, metrics, clock, released)


def prompt(length: int, first: int) -> list[int]:
    return list(range(first, first + length))


def planned(plan: StepPlan) -> list[tuple[str, int, int]]:
    """(request, first token, tokens) of each chunk, in plan order."""
    return [
        (r.request_id, c.start, c.num_new) for r, c in zip(plan.requests, plan.chunks, strict=True)
    ]


def test_decodes_go_first_then_prefill_chunks_within_the_token_budget() -> None:
    rig = make_rig(max_batch_tokens=16)
    rig.request("a", prompt(10, 100))
    rig.request("b", prompt(30, 200))
    assert planned(rig.step()) == [("a", 0, 10), ("b", 0, 6)]
    assert [len(r.page_table) for r in rig.running()] == [3, 2]  # pages for the step
    assert planned(rig.step()) == [("a", 10, 1), ("b", 6, 15)]
    assert planned(rig.step()) == [("a", 11, 1), ("b", 21, 9)]


def test_admission_waits_while_running_requests_take_every_sequence() -> None:
    rig = make_rig(max_num_seqs=1)
    first = rig.request("first", prompt(6, 100))
    assert planned(rig.step()) == [("first", 0, 6)]
    second = rig.request("second", prompt(6, 200))
    assert planned(rig.step()) == [("first", 6, 1)]  # the decode takes the only sequence
    assert rig.waiting() == [second] and second.page_table == []
    rig.finish(first)
    assert planned(rig.step()) == [("second", 0, 6)]
    assert not rig.waiting()


def test_with_the_default_sequences_waiting_prompts_join_steps_beside_32_decodes() -> None:
    """Decoding requests hold their sequences for the rest of their outputs; with the default
    --max-num-seqs, prompts arriving behind 32 of them still join the next step's prefill
    budget at once instead of waiting for decodes to finish."""
    rig = make_rig(device_pages=256, max_num_seqs=EngineConfig.max_num_seqs, max_batch_tokens=512)
    first = [rig.request(f"first{i}", prompt(6, 100 * i)) for i in range(32)]
    rig.step()
    assert all(r.num_pending == 1 for r in first)  # each prompt computed: decoding
    later = [rig.request(f"later{i}", prompt(6, 5000 + 100 * i)) for i in range(16)]
    plan = planned(rig.step())
    assert plan == [(r.request_id, 6, 1) for r in first] + [(r.request_id, 0, 6) for r in later]
    assert not rig.waiting()


def test_the_prefill_budget_goes_to_the_fewest_tokens_left_first_aged_unless_fcfs() -> None:
    """A short prompt admitted beside a long one mid-prefill takes the step's prefill budget
    first under lpm; the long one's wait counts against its tokens left (4096 a second), so once
    it arrived 20 ms earlier (82 tokens of aging against 38 more tokens left) it keeps its turn.
    fcfs keeps admission order."""
    cases = (
        (SchedulePolicy.LPM, 0.0, [("short", 0, 6), ("long", 16, 10)]),
        (SchedulePolicy.LPM, 0.02, [("long", 16, 16)]),
        (SchedulePolicy.FCFS, 0.0, [("long", 16, 16)]),
    )
    for policy, gap_s, expected in cases:
        rig = make_rig(device_pages=64, max_batch_tokens=16, policy=policy)
        rig.request("long", prompt(60, 100))
        assert planned(rig.step()) == [("long", 0, 16)]
        rig.clock.advance(gap_s)
        rig.request("short", prompt(6, 500))
        assert planned(rig.step()) == expected, (policy, gap_s)
        assert not rig.waiting()  # admitted either way: it holds a sequence, not the budget


def test_the_longest_cached_prefix_is_admitted_first_unless_fcfs() -> None:
    for policy, expected in ((SchedulePolicy.LPM, "warm"), (SchedulePolicy.FCFS, "cold")):
        rig = make_rig(max_num_seqs=1, policy=policy)
        history = prompt(20, 100)
        rig.finish(_run_prefill(rig, "history", history))
        rig.request("cold", prompt(20, 500))
        rig.request("warm", [*history, 1, 2])
        assert [r.request_id for r in rig.step().requests] == [expected], policy


def test_max_num_seqs_caps_the_requests_admitted_not_only_those_forwarded() -> None:
    rig = make_rig(max_num_seqs=2)
    for name in ("a", "b", "c", "d"):
        rig.request(name, prompt(6, 100 * (ord(name) - 96)))
    rig.step()
    assert [r.request_id for r in rig.running()] == ["a", "b"]
    assert [r.request_id for r in rig.waiting()] == ["c", "d"]  # not admitted, no pages
    assert all(r.page_table == [] for r in rig.waiting())


def test_priorities_follow_the_tree_as_it_is_now_not_at_arrival() -> None:
    """Both arrive while the cache is empty; then a running request inserts the prefix that one
    of them shares: that one goes first, though its match at arrival was as cold as the
    other's (and it arrived later)."""
    for policy, expected in ((SchedulePolicy.LPM, "sibling"), (SchedulePolicy.FCFS, "other")):
        rig = make_rig(max_num_seqs=1, policy=policy)
        template = prompt(20, 100)
        first = rig.request("first", [*template, 1])
        rig.request("other", prompt(20, 500))
        rig.request("sibling", [*template, 2])
        assert [r.request_id for r in rig.step().requests] == ["first"]
        rig.finish(first)  # its prompt's pages are in the tree now
        assert [r.request_id for r in rig.step().requests] == [expected], policy


def _run_prefill(rig: Rig, request_id: str, ids: list[int]) -> Request:
    request = rig.request(request_id, ids)
    rig.step()
    assert request.kv_len == len(ids)
    return request


def test_a_request_waits_in_promoting_until_its_host_pages_are_on_the_device() -> None:
    rig = make_rig(device_pages=8, host_pages=8, max_num_seqs=1)
    history = prompt(16, 100)
    rig.finish(_run_prefill(rig, "history", history))
    assert rig.cache.evict(Tier.DEVICE, 8) is False  # its pages start towards host
    rig.executor.complete_all()
    rig.step()
    again = rig.request("again", [*history, 1, 2])
    other = rig.request("other", prompt(4, 300))
    assert rig.step().requests == []  # admitted, promoting: it holds the only sequence slot
    assert again.status is RequestStatus.PROMOTING and other in rig.waiting()
    assert rig.step().requests == []  # the copy is not done yet
    rig.executor.complete_all()
    plan = rig.step()
    assert planned(plan) == [("again", 16, 2)]  # the promoted 16 tokens are not forwarded
    assert again.cached_by_tier[Tier.HOST] == 16
    assert rig.metrics.promotion_seconds.count(from_tier=Tier.HOST.label) == 1


def test_an_abort_during_a_promotion_ends_the_request_when_the_promotion_is_done() -> None:
    rig = make_rig(device_pages=8, host_pages=8)
    history = prompt(16, 100)
    rig.finish(_run_prefill(rig, "history", history))
    rig.cache.evict(Tier.DEVICE, 8)
    rig.executor.complete_all()
    rig.step()
    again = rig.request("again", [*history, 1, 2])
    rig.step()
    assert again.status is RequestStatus.PROMOTING
    again.finish_reason = FinishReason.ABORT  # what Engine.abort does to a promoting request
    rig.executor.complete_all()
    assert rig.scheduler.apply_transfers() == [again]
    assert not rig.scheduler.has_work
    rig.scheduler.remove(again, keep_computed=True)
    assert rig.cache.num_locks() == 0 and again.page_table == []
    assert rig.cache.check_integrity().ok


def test_a_full_device_preempts_the_youngest_running_request() -> None:
    rig = make_rig(device_pages=8)  # two sequences of 16 tokens fill it
    a = rig.request("a", prompt(14, 100))
    b = rig.request("b", prompt(14, 200))
    assert planned(rig.step()) == [("a", 0, 14), ("b", 0, 14)]
    for _ in range(2):  # 15 and 16 tokens still fit in 4 pages each
        assert [r.request_id for r in rig.step().requests] == ["a", "b"]
    assert rig.cache.device_pool.num_free == 0
    plan = rig.step()  # a's 17th token needs a fifth page: b goes back to the queue
    assert plan.requests == [a] and len(a.page_table) == 5
    assert rig.metrics.preemptions.value() == 1
    assert rig.released == [b.seq_id] and b.num_preemptions == 1
    # b's computed pages went into the tree: it came back at once with 3 of its 4 full pages
    # (the fourth was dropped to make a's room: no lower tier), and waits for pages to grow
    assert b.status is RequestStatus.RUNNING and b.kv_len == 12
    assert len(b.page_table) == 3 and b.cached_tokens == 0  # usage: its first admission's
    rig.finish(a)
    assert planned(rig.step()) == [("b", 12, 5)]


def test_no_preemption_while_transfers_are_in_flight() -> None:
    # write-through copies every inserted page to host: the test holds them in flight
    rig = make_rig(device_pages=8, host_pages=16, write_policy=WritePolicy.WRITE_THROUGH)
    a = rig.request("a", prompt(14, 100))
    b = rig.request("b", prompt(14, 200))
    for _ in range(3):
        rig.step()
    assert rig.cache.transfers_in_flight() and rig.cache.device_pool.num_free == 0
    for _ in range(2):  # neither can grow; nobody is preempted while the copies run
        assert rig.step().requests == []
    assert rig.metrics.preemptions.value() == 0
    rig.executor.complete_all()
    assert rig.step().requests == [a]  # the copies applied: b makes room
    assert rig.metrics.preemptions.value() == 1 and b.status is RequestStatus.WAITING


def test_a_request_waits_for_a_prefix_a_running_request_is_computing() -> None:
    """lpm: the sibling of a request still prefilling a shared template waits until the
    template's pages are in the tree, then reuses them. FCFS admits it beside the first in the
    step that leaves room (the first's last chunk), and it computes the template again."""
    for policy in (SchedulePolicy.LPM, SchedulePolicy.FCFS):
        rig = make_rig(max_batch_tokens=32, policy=policy)
        template = prompt(40, 100)
        rig.request("first", [*template, 1])
        sibling = rig.request("sibling", [*template, 2])
        for _ in range(4):  # first's prefill ends; its pages are inserted as it goes
            rig.step()
            if sibling.status is RequestStatus.RUNNING:
                break
        if policy is SchedulePolicy.FCFS:  # beside first: nothing of the template was cached
            assert sibling.cached_tokens == 0
            assert rig.metrics.deferred_admissions.value() == 0
            continue
        assert sibling.cached_tokens == 40  # the whole template came from the tree
        assert rig.metrics.deferred_admissions.value() == 1  # counted once, not per step


def test_a_wait_for_a_shared_prefix_lasts_while_the_prefix_is_computed() -> None:
    """However slowly first's prefill goes (a second a step here, under a deep queue), the
    sibling waits for it rather than computing the template a second time beside it."""
    rig = make_rig(max_batch_tokens=16)
    template = prompt(40, 100)
    first = rig.request("first", [*template, 1])
    sibling = rig.request("sibling", [*template, 2])
    while first.kv_len < len(first.spec.prompt_ids):
        assert sibling.status is RequestStatus.WAITING
        rig.step()
        rig.clock.advance(1.0)
    while sibling.status is not RequestStatus.RUNNING:
        rig.step()
    assert sibling.deferred_s >= 2.0
    assert sibling.cached_tokens == 40  # the whole template came from the tree


def test_a_request_waiting_for_a_shared_prefix_keeps_its_place() -> None:
    """Passed over while first computes the template, the sibling keeps its sequence: a
    later request is not admitted into it, and the sibling runs as soon as the template is
    in the tree, ahead of the later one."""
    rig = make_rig(max_num_seqs=2, max_batch_tokens=16)
    template = prompt(40, 100)
    first = rig.request("first", [*template, 1])
    rig.step()
    sibling = rig.request("sibling", [*template, 2])
    later = rig.request("later", prompt(8, 500))
    while first.kv_len < len(first.spec.prompt_ids):
        rig.step()
        assert sibling.status is RequestStatus.WAITING
        assert later.status is RequestStatus.WAITING  # the second sequence is the sibling's
    rig.step()
    assert sibling.status is RequestStatus.RUNNING and sibling.cached_tokens == 40
    assert later.status is RequestStatus.WAITING


def test_a_wait_for_a_shared_prefix_ends_when_its_request_is_preempted() -> None:
    """A request preempted mid-prefill holds nobody: the sibling is admitted with the pages
    the preempted one put into the tree, and computes the rest itself."""
    rig = make_rig(max_batch_tokens=16)
    template = prompt(40, 100)
    first = rig.request("first", [*template, 1])
    rig.step()
    sibling = rig.request("sibling", [*template, 2])
    rig.pages.on_arrival(sibling)
    assert rig.scheduler._waits_for_shared_prefix(sibling, rig.clock())
    rig.scheduler._preempt(first)
    rig.pages.on_arrival(sibling)
    assert not rig.scheduler._waits_for_shared_prefix(sibling, rig.clock())
    assert sum(sibling.kv.matched_tokens_by_tier.values()) == 16  # first's computed pages


def test_admission_keeps_room_for_the_prompts_already_admitted() -> None:
    """Three 40-token prompts need 11 pages each; the device has 32: the third waits for room
    instead of being admitted and preempting (or being preempted by) the others mid-prefill."""
    rig = make_rig(device_pages=32, max_batch_tokens=16)
    for name, first in (("a", 100), ("b", 200), ("c", 300)):
        rig.request(name, prompt(40, first))
    rig.step()
    assert [r.request_id for r in rig.running()] == ["a", "b"]
    assert [r.request_id for r in rig.waiting()] == ["c"]
    while any(r.num_pending > 1 for r in rig.running()[:2]):
        rig.step()
    assert rig.metrics.preemptions.value() == 0


def test_priorities_of_a_long_queue_are_refreshed_in_turn() -> None:
    """Past 64 waiting requests, each admission re-matches the next 64 in turn: the sibling
    queued last, behind 70 requests, all matched cold at arrival, is found warm once the
    first request's template is in the tree, and goes first."""
    rig = make_rig(device_pages=64, max_num_seqs=1, max_batch_tokens=16)
    rig.scheduler.order = QueueOrder(SchedulePolicy.LPM, aging_tokens_per_second=1.0)
    template = prompt(20, 100)
    first = rig.request("first", [*template, 1])
    for index in range(70):
        rig.request(f"cold{index}", prompt(8, 1000 + 10 * index))
    sibling = rig.request("sibling", [*template, 2])
    assert sum(sibling.kv.matched_tokens_by_tier.values()) == 0  # the tree was empty
    for _ in range(3):  # first's prefill and decode; every step re-matches 64 more
        assert rig.step().requests == [first]
    rig.finish(first)
    assert rig.step().requests == [sibling] and sibling.cached_tokens == 20


def test_a_host_match_ranks_above_an_equal_disk_match_and_a_device_one_above_both() -> None:
    """Pages still to be read count for less than pages ready on the device: 400 matched
    tokens each (set, not matched: the order's arithmetic), arrivals 1 ms apart."""
    rig = make_rig()
    for name, matched in (("disk", {Tier.DISK: 400}), ("device", {Tier.DEVICE: 400}),
                          ("host", {Tier.HOST: 400})):  # fmt: skip
        request = rig.request(name, prompt(24, 100 * len(name)))
        request.kv._matched_by_tier = {**dict.fromkeys(Tier, 0), **matched}
    order = rig.scheduler.order.ordered(rig.waiting(), rig.clock())
    assert [r.request_id for r in order] == ["device", "host", "disk"]


def test_every_tier_has_a_weight_in_the_queue_order() -> None:
    from tieredkv.engine.queue_order import TIER_WEIGHT

    assert set(TIER_WEIGHT) == set(Tier)
    weights = [TIER_WEIGHT[tier] for tier in Tier]
    assert weights == sorted(weights, reverse=True)  # a slower tier is never worth more

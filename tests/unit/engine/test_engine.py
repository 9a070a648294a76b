"""The engine's step loop over the tiered cache, deterministically (manual transfers, fake
clock, fp32 tiny model). check_integrity() runs after every step (see conftest.Harness)."""

from __future__ import annotations

from tests.unit.engine.conftest import PAGE_SIZE, prompt, pushed_to_disk
from tieredkv.cache.tier import Tier
from tieredkv.config import SchedulePolicy, WritePolicy
from tieredkv.engine.protocol import FinishReason
from tieredkv.engine.request import RequestStatus
from tieredkv.model.workspace import Workspace


def reference_outputs(make_harness, prompts: dict[str, list[int]], max_tokens: int) -> dict:
    """Each prompt alone on a roomy engine with no reuse: the tokens every run must match."""
    harness = make_harness(reuse=False)
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens)
        harness.run()
    return {request_id: harness.tokens(request_id) for request_id in prompts}


def test_cached_and_uncached_runs_generate_the_same_tokens(make_harness) -> None:
    shared = prompt(40, seed=1)
    prompts = {"a": shared + prompt(9, 2), "b": shared + prompt(13, 3), "c": shared + prompt(5, 4)}
    expected = reference_outputs(make_harness, prompts, max_tokens=12)
    harness = make_harness()
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens=12)
        harness.run()
    assert {r: harness.tokens(r) for r in prompts} == expected
    # "a" computed the shared 40 tokens (10 pages); the others reused them from the device
    assert harness.usage("a").cached_tokens == 0
    for request_id in ("b", "c"):
        usage = harness.usage(request_id)
        assert usage.cached_tokens == 40
        assert usage.cached_tokens_by_tier == {"device": 40, "host": 0, "disk": 0, "remote": 0}


def test_next_turn_reuses_prompt_and_answer(make_harness) -> None:
    harness = make_harness()
    turn1 = prompt(30, seed=5)
    harness.submit("t1", turn1, max_tokens=10)
    harness.run()
    answer = harness.tokens("t1")
    turn2 = turn1 + answer + prompt(6, seed=6)
    harness.submit("t2", turn2, max_tokens=4)
    harness.run()
    # prompt + output[:-1] went into the tree, floored to whole pages
    assert harness.usage("t2").cached_tokens == (30 + 10 - 1) // PAGE_SIZE * PAGE_SIZE


def test_device_hit_proceeds_while_another_waits_for_promotion(make_harness) -> None:
    harness = make_harness(device_pages=40, host_pages=64)
    cold, hot = prompt(48, seed=7), prompt(24, seed=8)
    harness.submit("cold", cold, max_tokens=2)
    harness.submit("hot", hot, max_tokens=2)
    harness.run()
    # push "cold" out of the device into host by running other work (LRU); "hot" stays in use
    for i in range(5):
        harness.submit(f"filler{i}", prompt(44, seed=20 + i), max_tokens=2)
        harness.run()
        harness.submit(f"hot-again{i}", hot, max_tokens=1)
        harness.run()
    assert harness.cache.match(cold, "").host.num_pages > 0
    assert harness.cache.match(hot, "").device.num_pages > 0

    harness.auto_complete = False
    harness.submit("cold2", [*cold, 5, 6], max_tokens=2)
    harness.submit("hot2", [*hot, 5, 6], max_tokens=2)
    for _ in range(40):  # promotions (towards the device) are held back; demotions complete
        harness.step()
        for ticket in harness.executor.pending():
            if ticket.dst_tier is not Tier.DEVICE:
                harness.executor.complete(ticket)
    assert harness.finished("hot2")  # ran while cold2's promotion is held back
    assert not harness.finished("cold2")
    assert harness.executor.pending()
    harness.auto_complete = True
    harness.run()
    usage = harness.usage("cold2")
    assert usage.cached_tokens_by_tier["host"] > 0
    assert sum(usage.cached_tokens_by_tier.values()) == usage.cached_tokens


def test_longest_match_runs_first(make_harness) -> None:
    harness = make_harness(max_num_seqs=1)
    base = prompt(64, seed=9)
    harness.submit("warm", base, max_tokens=1)
    harness.run()
    harness.submit("blocker", prompt(8, seed=10), max_tokens=3)
    harness.step()  # the blocker holds the only sequence slot
    harness.submit("none", prompt(40, seed=11), max_tokens=1)
    harness.submit("short", base[:20] + prompt(20, seed=12), max_tokens=1)
    harness.submit("long", base[:60] + prompt(20, seed=13), max_tokens=1)
    order = []
    for _ in range(200):
        harness.step()
        for request_id in ("none", "short", "long"):
            if harness.finished(request_id) and request_id not in order:
                order.append(request_id)
        if len(order) == 3:
            break
    assert order == ["long", "short", "none"]


def test_fcfs_keeps_arrival_order(make_harness) -> None:
    harness = make_harness(max_num_seqs=1, policy=SchedulePolicy.FCFS)
    base = prompt(64, seed=9)
    harness.submit("warm", base, max_tokens=1)
    harness.run()
    harness.submit("none", prompt(40, seed=11), max_tokens=1)
    harness.clock.advance(0.001)
    harness.submit("long", base[:60] + prompt(20, seed=13), max_tokens=1)
    order = []
    for _ in range(200):
        harness.step()
        for request_id in ("none", "long"):
            if harness.finished(request_id) and request_id not in order:
                order.append(request_id)
        if len(order) == 2:
            break
    assert order == ["none", "long"]


def test_aging_bounds_a_cold_requests_wait(make_harness) -> None:
    """A steady stream of hot requests (each matching 60 tokens) cannot starve a cold one: it
    runs once its wait is worth more than any match (max_model_len / aging rate)."""
    harness = make_harness(max_num_seqs=1)
    engine = harness.engine
    hot_base = prompt(64, seed=14)
    harness.submit("warm", hot_base, max_tokens=1)
    harness.run()
    harness.submit("cold", prompt(40, seed=15), max_tokens=1)
    bound = 256 / engine.scheduler.order.aging_tokens_per_second  # max_model_len / rate
    step_seconds = 0.01
    waited = 0.0
    for i in range(1000):
        harness.submit(f"hot{i}", hot_base[:60] + prompt(8, seed=100 + i), max_tokens=1)
        harness.step()
        harness.clock.advance(step_seconds)
        waited += step_seconds
        if harness.finished("cold"):
            break
    assert harness.finished("cold")
    assert waited <= bound + 0.1, f"cold waited {waited:.2f} s, bound {bound:.2f} s"
    hot_first = [i for i in range(1000) if harness.finished(f"hot{i}")]
    assert hot_first, "hot requests went first while the cold one was young"


def test_preemption_when_device_is_full_keeps_outputs(make_harness) -> None:
    prompts = {f"r{i}": prompt(30, seed=30 + i) for i in range(4)}
    expected = reference_outputs(make_harness, prompts, max_tokens=40)
    # 4 sequences of up to 70 tokens need 72 pages; the device has 40 (+ host for demotion)
    harness = make_harness(device_pages=40, host_pages=128, max_num_seqs=4)
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens=40)
    harness.run()
    assert {r: harness.tokens(r) for r in prompts} == expected
    assert harness.metrics.preemptions.value() > 0
    assert not harness.cache.index.lock_holders


def test_abort_frees_pages_and_locks(make_harness) -> None:
    harness = make_harness()
    harness.submit("long", prompt(50, seed=40), max_tokens=100)
    harness.submit("queued", prompt(10, seed=41), max_tokens=5)
    for _ in range(3):
        harness.step()
    harness.engine.abort("long")
    harness.engine.abort("queued")
    harness.engine.abort("unknown")  # harmless
    harness.run()
    assert harness.outputs["long"][-1].finish_reason is FinishReason.ABORT
    assert harness.outputs["queued"][-1].finish_reason is FinishReason.ABORT
    assert not harness.cache.index.lock_holders
    assert not harness.cache.index.private_pages
    assert harness.engine.runner.attention.num_workspaces == 0


def test_namespaces_share_nothing(make_harness) -> None:
    harness = make_harness()
    ids = prompt(40, seed=50)
    harness.submit("a", ids, max_tokens=2, namespace="tenant-a")
    harness.run()
    harness.submit("b", ids, max_tokens=2, namespace="tenant-b")
    harness.run()
    harness.submit("a2", ids, max_tokens=2, namespace="tenant-a")
    harness.run()
    assert harness.usage("b").cached_tokens == 0
    assert harness.usage("a2").cached_tokens == 36
    assert harness.tokens("a") == harness.tokens("b") == harness.tokens("a2")


def test_history_demoted_to_disk_is_promoted_and_answers_the_same(
    make_harness, monkeypatch
) -> None:
    history = prompt(60, seed=60)
    expected = reference_outputs(make_harness, {"again": [*history, 7, 8]}, max_tokens=6)
    harness = pushed_to_disk(make_harness, history)
    skipped: list[int] = []  # per workspace fill, the page positions it found already there
    fill = Workspace.fill_from_pool

    def counting_fill(self, pool, page_ids, length, helper=None, landed=None):
        skipped.append(0 if landed is None else int(landed.sum()))
        fill(self, pool, page_ids, length, helper, landed)

    monkeypatch.setattr(Workspace, "fill_from_pool", counting_fill)
    harness.submit("again", [*history, 7, 8], max_tokens=6)
    harness.run()
    assert harness.tokens("again") == expected["again"]
    usage = harness.usage("again")
    assert usage.cached_tokens_by_tier["disk"] > 0
    assert harness.metrics.promotion_seconds.count(from_tier=Tier.DISK.label) == 1
    # every page read went into the workspace as it landed (tieredkv.model.promotion_fill)
    fills = harness.engine.runner.attention._promotion_fills
    assert fills.landed_pages == usage.cached_tokens_by_tier["disk"] // PAGE_SIZE
    assert skipped == [fills.landed_pages]  # and the first chunk used them, copying none again
    assert len(fills) == 0 and harness.engine.runner.attention.num_workspaces == 0


def test_a_sampling_error_ends_only_its_own_request(make_harness, monkeypatch) -> None:
    prompts = {"good": prompt(21, seed=70), "bad": prompt(17, seed=71)}
    expected = reference_outputs(make_harness, {"good": prompts["good"]}, max_tokens=6)
    harness = make_harness()
    sampler = harness.engine.sampler
    real_sample = sampler.sample

    def failing_for_seven(logits, params, generators, banned=None, outputs=None):
        if any(p.max_tokens == 7 for p in params):
            raise ValueError("bad sampling parameters")
        return real_sample(logits, params, generators, banned, outputs)

    monkeypatch.setattr(sampler, "sample", failing_for_seven)
    harness.submit("good", prompts["good"], max_tokens=6)
    harness.submit("bad", prompts["bad"], max_tokens=7)  # sampled in the same steps as "good"
    harness.run()
    assert harness.tokens("good") == expected["good"]
    last = harness.outputs["bad"][-1]
    assert last.finish_reason is FinishReason.ERROR and "bad sampling parameters" in last.error
    assert harness.outputs["good"][-1].finish_reason is FinishReason.LENGTH
    assert not harness.cache.index.lock_holders and not harness.cache.index.private_pages


def test_queue_time_ends_where_the_first_forward_begins(make_harness) -> None:
    harness = make_harness()
    runner = harness.engine.runner
    real_forward = runner.forward

    def slow_forward(chunks):
        harness.clock.advance(5.0)  # every forward takes 5 s of engine time
        return real_forward(chunks)

    runner.forward = slow_forward
    harness.submit("r", prompt(9, seed=80), max_tokens=1)
    harness.run()
    text = harness.metrics.render()
    assert "tieredkv_queue_seconds_sum 0\n" in text  # admitted at once: no queueing
    assert "tieredkv_time_to_first_token_seconds_sum 5\n" in text


def test_a_queued_request_prefetches_its_disk_pages_once(make_harness, monkeypatch) -> None:
    """Prefetch to host is for a request that stays queued (one admitted at once promotes
    disk -> device itself: a prefetch beside it would read the same pages twice)."""
    history = prompt(60, seed=81)
    harness = make_harness(device_pages=70, host_pages=32, disk_pages=256, max_num_seqs=1)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(6):
        harness.submit(f"other{i}", prompt(60, seed=100 + i), max_tokens=2)
        harness.run()
    assert harness.cache.match(history, "").disk.num_pages > 0
    prefetched = []
    real_prefetch = harness.cache.prefetch
    monkeypatch.setattr(
        harness.cache, "prefetch", lambda match: prefetched.append(match) or real_prefetch(match)
    )
    harness.submit("busy", prompt(40, seed=120), max_tokens=8)
    harness.step()  # "busy" runs and holds the only sequence slot
    assert prefetched == []  # admitted at once: nothing to prefetch for it
    harness.submit("again", [*history, 7, 8], max_tokens=2)
    harness.step()  # "again" waits: its disk pages start towards host
    harness.step()  # the copy, completed, is applied
    assert len(prefetched) == 1  # once, not every step it waits
    waiting = harness.engine.scheduler.queued(RequestStatus.WAITING)
    assert harness.engine.requests["again"] in waiting
    disk_to_host = harness.cache.counters.transfer_bytes[(Tier.DISK, Tier.HOST)]
    assert disk_to_host > 0
    harness.run()
    assert harness.usage("again").cached_tokens > 0


def test_write_policy_decides_when_computed_pages_reach_host(make_harness, write_policy) -> None:
    """Without device pressure, write-back copies nothing down; write-through copies every full
    page the request put in the tree (prompt + output[:-1]) to host in the background."""
    harness = make_harness(host_pages=64)
    ids = prompt(40, seed=90)
    harness.submit("r", ids, max_tokens=3)
    harness.run()
    num_pages = (40 + 3 - 1) // PAGE_SIZE
    copied = harness.cache.counters.transfer_bytes[Tier.DEVICE, Tier.HOST]
    written = num_pages if write_policy is WritePolicy.WRITE_THROUGH else 0
    assert copied == written * harness.cache.layout.page_bytes
    assert harness.cache.match([*ids, 1], "").device.num_pages == 10  # the device copy stays

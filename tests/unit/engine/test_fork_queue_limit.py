"""--max-queue holds for forks: a sequence forked off a request (`n` > 1) that finds no device
page free and would push the waiting queue past the limit is refused as a new request is,
while the parent, the forks placed and the prompt's pages in the tree go on unaffected."""

from __future__ import annotations

from tests.unit.engine.conftest import PAGE_SIZE, prompt
from tieredkv.engine.protocol import FinishReason
from tieredkv.engine.request import RequestStatus
from tieredkv.model.sampler import SamplingParams

PROMPT_LEN = 4 * PAGE_SIZE + 3  # four full pages the forks share, a partial one each copies
# the parent's five prompt pages and one more (the partial page of the first fork): the second
# fork finds no page free and waits, the third finds the queue full
DEVICE_PAGES = 6
SAMPLING = SamplingParams(max_tokens=3, temperature=0.9, seed=11, ignore_eos=True, n=4)


def finished_by_index(harness, request_id: str) -> dict[int, FinishReason | None]:
    return {o.index: o.finish_reason for o in harness.outputs[request_id] if o.finished}


def test_a_fork_past_max_queue_is_refused_and_the_rest_goes_on(make_harness) -> None:
    ids = prompt(PROMPT_LEN, seed=41)
    harness = make_harness(device_pages=DEVICE_PAGES, max_queue=1)
    harness.submit("forked", ids, sampling=SAMPLING)
    harness.step()  # the prompt is computed and the first tokens sampled: the forks are made
    refused = [o for o in harness.outputs["forked"] if o.index == 3]
    assert len(refused) == 1 and refused[0].finished and not refused[0].new_token_ids
    assert refused[0].finish_reason is FinishReason.QUEUE_FULL
    assert "--max-queue" in (refused[0].error or "")
    assert "forked/3" not in harness.engine.requests  # it holds no page and no lock
    queued = harness.engine.scheduler.queued
    assert [r.index for r in queued(RequestStatus.RUNNING)] == [0, 1]
    assert [r.index for r in queued(RequestStatus.WAITING)] == [2]  # at --max-queue 1
    harness.run()
    assert finished_by_index(harness, "forked") == {
        0: FinishReason.LENGTH,
        1: FinishReason.LENGTH,
        2: FinishReason.LENGTH,
        3: FinishReason.QUEUE_FULL,
    }
    # the sequences that ran are those an unlimited queue gives
    unlimited = make_harness(device_pages=DEVICE_PAGES)
    unlimited.submit("forked", ids, sampling=SAMPLING)
    unlimited.run()
    for index in (0, 1, 2):
        tokens = [t for o in harness.outputs["forked"] if o.index == index for t in o.new_token_ids]
        expected = [
            t for o in unlimited.outputs["forked"] if o.index == index for t in o.new_token_ids
        ]
        assert tokens == expected, f"sequence {index}"
    # the prompt's pages are in the tree, and every request's page and lock was given back
    assert harness.cache.match(ids, "").device.num_pages >= 4
    assert not harness.engine.requests and harness.cache.num_locks() == 0
    harness.cache.flush()
    assert harness.cache.device_pool.num_free == DEVICE_PAGES


def test_forks_within_max_queue_all_run(make_harness) -> None:
    harness = make_harness(device_pages=DEVICE_PAGES, max_queue=2)
    harness.submit("forked", prompt(PROMPT_LEN, seed=41), sampling=SAMPLING)
    harness.run()
    reasons = finished_by_index(harness, "forked")
    assert reasons == dict.fromkeys(range(4), FinishReason.LENGTH)

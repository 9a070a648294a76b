"""LM-program features inside the engine: forks (`n` > 1), logprobs, prompt logprobs (echo),
logit_bias and penalties (fp32 tiny model, deterministic harness)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.engine.conftest import PAGE_SIZE, prompt
from tieredkv.engine.protocol import FinishReason
from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.sampler import SamplingParams


def choice_tokens(harness, request_id: str, n: int) -> list[list[int]]:
    outputs = harness.outputs[request_id]
    return [[t for o in outputs if o.index == i for t in o.new_token_ids] for i in range(n)]


def prefilled(harness) -> float:
    return harness.metrics.prefill_tokens.value()


@pytest.mark.parametrize("prompt_len", [4 * PAGE_SIZE, 4 * PAGE_SIZE + 3])
def test_n_forks_prefill_once_and_each_equals_its_own_seeded_request(
    make_harness, prompt_len: int
) -> None:
    ids = prompt(prompt_len, seed=31)
    sampling = SamplingParams(max_tokens=10, temperature=0.9, seed=7, ignore_eos=True, n=4)
    harness = make_harness()
    harness.submit("forked", ids, sampling=sampling)
    harness.run()
    forked = choice_tokens(harness, "forked", 4)
    assert prefilled(harness) == prompt_len  # the prompt was computed once, not four times
    finished = [o for o in harness.outputs["forked"] if o.finished]
    assert sorted(o.index for o in finished) == [0, 1, 2, 3]
    assert all(o.finish_reason is FinishReason.LENGTH for o in finished)
    assert len({tuple(tokens) for tokens in forked}) > 1  # sampled: the choices differ
    alone = make_harness(reuse=False)
    for i in range(4):
        one = SamplingParams(max_tokens=10, temperature=0.9, seed=7 + i, ignore_eos=True)
        alone.submit(f"seed{i}", ids, sampling=one)
        alone.run()
        assert alone.tokens(f"seed{i}") == forked[i], f"choice {i}"
    assert not harness.engine.requests  # every fork ended and released its pages


def test_greedy_forks_are_identical_without_cache_reuse(make_harness) -> None:
    ids = prompt(4 * PAGE_SIZE + 1, seed=32)
    harness = make_harness(reuse=False)
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=3)
    harness.submit("greedy", ids, sampling=sampling)
    harness.run()
    forked = choice_tokens(harness, "greedy", 3)
    harness.submit("single", ids, max_tokens=8)
    harness.run()
    assert forked == [harness.tokens("single")] * 3
    assert prefilled(harness) == 2 * len(ids)  # once for the three forks, once for "single"


def test_abort_ends_every_fork_and_frees_their_pages(make_harness) -> None:
    harness = make_harness()
    free_before = harness.cache.device_pool.num_free
    sampling = SamplingParams(max_tokens=50, temperature=1.0, ignore_eos=True, n=3)
    harness.submit("many", prompt(18, seed=33), sampling=sampling)
    for _ in range(4):
        harness.step()
    assert len(harness.engine.requests) == 3
    harness.engine.abort("many")
    finished = [o for o in harness.outputs["many"] if o.finished]
    assert sorted(o.index for o in finished) == [0, 1, 2]
    assert all(o.finish_reason is FinishReason.ABORT for o in finished)
    assert not harness.engine.requests
    harness.engine.cache.flush()
    assert harness.cache.device_pool.num_free == free_before


def test_abort_before_the_first_token_ends_the_unforked_sequences_too(make_harness) -> None:
    harness = make_harness(max_batch_tokens=8)
    sampling = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True, n=3)
    harness.submit("early", prompt(40, seed=34), sampling=sampling)
    harness.step()  # the first 8 of 40 prompt tokens
    harness.engine.abort("early")
    finished = [o for o in harness.outputs["early"] if o.finished]
    assert sorted(o.index for o in finished) == [0, 1, 2]


def reference_logits(harness, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids`, computed alone in one chunk (no cache)."""
    runner = harness.engine.runner
    pages = runner.pool.alloc(-(-len(ids) // PAGE_SIZE))
    try:
        _, rows = runner.forward_with_rows([SequenceChunk(999, ids, 0, pages)], [0])
    finally:
        runner.release(999)
        runner.pool.free(pages)
    return rows[0]


def test_logprobs_are_the_log_softmax_of_the_raw_logits(make_harness) -> None:
    harness = make_harness(reuse=False)
    ids = prompt(13, seed=35)
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
    harness.submit("lp", ids, sampling=sampling)
    harness.run()
    tokens = harness.tokens("lp")
    logprobs = [lp for o in harness.outputs["lp"] for lp in o.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    expected = torch.log_softmax(reference_logits(harness, ids + tokens[:-1]), -1)
    for step, logprob in enumerate(logprobs):
        row = expected[len(ids) - 1 + step]
        assert logprob.logprob == pytest.approx(float(row[tokens[step]]), abs=1e-4)
        top_values, top_ids = row.topk(3)
        assert [i for i, _ in logprob.top] == top_ids.tolist()
        assert [v for _, v in logprob.top] == pytest.approx(top_values.tolist(), abs=1e-4)


def test_prompt_logprobs_are_equal_with_and_without_a_cached_prefix(make_harness) -> None:
    harness = make_harness(max_batch_tokens=16)
    shared = prompt(24, seed=36)
    ids = shared + prompt(9, seed=37)
    harness.submit("warm", shared + prompt(5, seed=38), max_tokens=2)  # caches `shared`
    harness.run()
    sampling = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    harness.submit("echo", ids, sampling=sampling)
    harness.run()
    cached = next(o.prompt_logprobs for o in harness.outputs["echo"] if o.prompt_logprobs)
    assert cached[0] is None and all(lp is not None for lp in cached[1:])
    assert [lp.token_id for lp in cached[1:]] == ids[1:]
    expected = torch.log_softmax(reference_logits(harness, ids), -1)
    for position in range(1, len(ids)):
        value = float(expected[position - 1, ids[position]])
        assert cached[position].logprob == pytest.approx(value, abs=1e-4)
        assert len(cached[position].top) == 2
    uncached = make_harness(reuse=False, max_batch_tokens=16)
    uncached.submit("echo", ids, sampling=sampling)
    uncached.run()
    fresh = next(o.prompt_logprobs for o in uncached.outputs["echo"] if o.prompt_logprobs)
    assert [(lp.token_id, lp.top) for lp in fresh[1:]] == [
        (lp.token_id, lp.top) for lp in cached[1:]
    ]
    assert [lp.logprob for lp in fresh[1:]] == pytest.approx([lp.logprob for lp in cached[1:]])
    assert uncached.tokens("echo") == harness.tokens("echo")


def test_logit_bias_forces_a_token(make_harness) -> None:
    harness = make_harness()
    sampling = SamplingParams(
        max_tokens=5, temperature=0.0, ignore_eos=True, logit_bias=((42, 100.0),)
    )
    harness.submit("biased", prompt(10, seed=39), sampling=sampling)
    harness.run()
    assert harness.tokens("biased") == [42] * 5


def test_frequency_penalty_stops_a_forced_repeat(make_harness) -> None:
    """A bias of +5 makes token 42 the greedy choice; each time it appears, a frequency penalty
    of 2 takes 2 off its logit, so it is chosen at most a few times, then others win."""
    harness = make_harness()
    biased = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias=((42, 30.0),)
    )
    harness.submit("plain", prompt(10, seed=40), sampling=biased)
    harness.run()
    assert harness.tokens("plain") == [42] * 12
    penalised = SamplingParams(
        max_tokens=12,
        temperature=0.0,
        ignore_eos=True,
        logit_bias=((42, 30.0),),
        frequency_penalty=2.0,
        presence_penalty=2.0,
    )
    harness.submit("penalised", prompt(10, seed=40), sampling=penalised)
    harness.run()
    tokens = harness.tokens("penalised")
    assert tokens[0] == 42 and tokens.count(42) < 12

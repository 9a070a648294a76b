"""Qwen3 and Gemma 3 (fp32) through the real engine over the tiered cache, against transformers
on the same directory: greedy tokens cold, with a prefix reused from the device, from host and
from disk, through chunked prefill batched with other sequences; logprobs. The Gemma 3 model's
window (128) holds most of these prompts and outputs; one prompt is longer than it."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.unit.engine.conftest import prompt, pushed_to_disk
from tests.unit.model.test_qwen3_gemma3_forward import hf_greedy, tiny_family_model
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.sampler import SamplingParams

WINDOW = 128
TOLERANCE = 2e-4  # fp32 logprobs: ours against transformers' (different kernels, same math)


@pytest.fixture(scope="module", params=["qwen3", "qwen3-tied", "gemma3"])
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Overrides the engine tests' tiny Llama: the harness runs this family."""
    overrides = {"sliding_window": WINDOW} if request.param == "gemma3" else {}
    model_dir = tiny_family_model(tmp_path_factory.mktemp("family"), request.param, **overrides)
    return load_model(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def hf_model(tiny_model: LoadedModel) -> transformers.PreTrainedModel:
    model_dir = tiny_model.model_dir
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_cold_and_device_reuse_equal_transformers(make_harness, hf_model) -> None:
    shared = prompt(40, seed=1)
    prompts = {"a": shared + prompt(9, 2), "b": shared + prompt(13, 3), "c": shared + prompt(5, 4)}
    harness = make_harness()
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens=12)
        harness.run()
        assert harness.tokens(request_id) == hf_greedy(hf_model, ids, 12), request_id
    assert harness.usage("a").cached_tokens == 0
    assert harness.usage("b").cached_tokens_by_tier["device"] == 40


def test_reuse_from_host_equals_transformers(make_harness, hf_model) -> None:
    harness = make_harness(device_pages=40, host_pages=64)
    history = prompt(48, seed=7)
    harness.submit("first", history, max_tokens=2)
    harness.run()
    for i in range(4):  # other conversations push it out of the device
        harness.submit(f"filler{i}", prompt(44, seed=20 + i), max_tokens=2)
        harness.run()
    assert harness.cache.match(history, "").host.num_pages > 0
    again = [*history, 5, 6]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["host"] > 0
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)


@pytest.mark.parametrize("split_disk", [False, True])
def test_reuse_from_disk_equals_transformers(make_harness, hf_model, split_disk: bool) -> None:
    """From whole-page records and, for Gemma 3 (sliding layers), from layer records."""
    history = prompt(60, seed=60)
    harness = pushed_to_disk(make_harness, history, split_disk=split_disk)
    again = [*history, 7, 8]
    harness.submit("again", again, max_tokens=8)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["disk"] > 0
    assert harness.tokens("again") == hf_greedy(hf_model, again, 8)


def test_chunked_prefill_batched_with_others_equals_transformers(make_harness, hf_model) -> None:
    """Prompts longer than a step's token budget, prefilled in chunks while others decode."""
    harness = make_harness(max_batch_tokens=16, max_num_seqs=4)
    prompts = {f"r{n}": prompt(n, seed=n) for n in (37, 5, 50, 23)}
    for request_id, ids in prompts.items():
        harness.submit(request_id, ids, max_tokens=10)
    harness.run()
    for request_id, ids in prompts.items():
        assert harness.tokens(request_id) == hf_greedy(hf_model, ids, 10), request_id


def hf_log_softmax(model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab): row i is the log-distribution of the token after ids[: i + 1]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_logprobs_equal(harness, request_id: str, ids: list[int], expected) -> None:
    """Each generated token's logprob and top 3 against `expected` (hf_log_softmax rows)."""
    tokens = harness.tokens(request_id)
    logprobs = [lp for o in harness.outputs[request_id] for lp in o.logprobs]
    assert len(logprobs) == len(tokens) > 0
    for step, logprob in enumerate(logprobs):
        row = expected[len(ids) - 1 + step]
        assert logprob.token_id == tokens[step] == int(row.argmax())
        assert logprob.logprob == pytest.approx(float(row.max()), abs=TOLERANCE)
        assert [i for i, _ in logprob.top] == row.topk(3).indices.tolist()


def test_logprobs_equal_transformers_with_a_cached_prefix(make_harness, hf_model) -> None:
    harness = make_harness(max_batch_tokens=16)
    shared = prompt(24, seed=36)
    ids = shared + prompt(9, seed=37)
    harness.submit("warm", shared + prompt(5, seed=38), max_tokens=2)  # caches `shared`
    harness.run()
    sampling = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    harness.submit("lp", ids, sampling=sampling)
    harness.run()
    assert harness.usage("lp").cached_tokens == 24
    assert_logprobs_equal(harness, "lp", ids, hf_log_softmax(hf_model, ids + harness.tokens("lp")))


def test_prompt_logprobs_equal_transformers(make_harness, hf_model) -> None:
    harness = make_harness(max_batch_tokens=16)
    ids = prompt(33, seed=39)
    sampling = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    harness.submit("echo", ids, sampling=sampling)
    harness.run()
    expected = hf_log_softmax(hf_model, ids)
    echoed = next(o.prompt_logprobs for o in harness.outputs["echo"] if o.prompt_logprobs)
    assert echoed[0] is None and len(echoed) == len(ids)
    for position in range(1, len(ids)):
        value = float(expected[position - 1, ids[position]])
        assert echoed[position].logprob == pytest.approx(value, abs=TOLERANCE)


def test_gemma3_prompt_longer_than_the_window_equals_transformers(
    make_harness, hf_model, tiny_model: LoadedModel
) -> None:
    """170 tokens against a window of 128: cold and chunked, and again from disk; tokens and
    logprobs."""
    if tiny_model.config.architecture != "gemma3_text":
        pytest.skip("only the Gemma 3 model has a window")
    history = prompt(170, seed=90)
    ids = [*history, 7, 8]
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    cold = make_harness(max_batch_tokens=48)
    cold.submit("cold", ids, sampling=sampling)
    cold.run()
    expected = hf_log_softmax(hf_model, ids + cold.tokens("cold"))
    assert_logprobs_equal(cold, "cold", ids, expected)
    harness = pushed_to_disk(make_harness, history)
    harness.submit("again", ids, sampling=sampling)
    harness.run()
    assert harness.usage("again").cached_tokens_by_tier["disk"] > 0
    assert_logprobs_equal(harness, "again", ids, expected)


def test_the_harness_serves_the_family(make_harness, tiny_model: LoadedModel) -> None:
    harness = make_harness()
    model_class = type(harness.engine.runner.model).__name__
    expected = "Gemma3Model" if tiny_model.config.architecture == "gemma3_text" else "LlamaModel"
    assert model_class == expected

"""LM programs through the official openai client against a real `tieredkv serve` (the default
model, fp32): n forks, logprobs and top_logprobs, echo with prompt logprobs (cached and not),
best_of, logit_bias, seed, stop and the presence/frequency penalties, checked against
transformers on the same weights."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch
import transformers

from tests.integration.server_process import ServerProcess
from tieredkv.model.loader import load_model

MODEL = "SmolLM2-135M-Instruct"
ARGS = ["--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8"]
QUESTION = [{"role": "user", "content": "Name three rivers of Europe and one fact about each."}]
TOLERANCE = 2e-4  # fp32 logprobs: ours against transformers' (different kernels, same math)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(ARGS, tmp_path_factory.mktemp("logs") / "lm.log")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf_model() -> transformers.PreTrainedModel:
    model_dir = load_model(None, dtype=torch.float32).model_dir
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def hf_log_softmax(model: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab): row i is the log-distribution of the token after ids[: i + 1]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))


def prompt_ids(client: openai.OpenAI, text: str) -> tuple[int, list[str]]:
    """How many tokens, and which, the server makes of a completion prompt (echo shows it)."""
    response = client.completions.create(
        model=MODEL, prompt=text, max_tokens=1, echo=True, logprobs=0, temperature=0
    )
    return response.usage.prompt_tokens, response.choices[0].logprobs.tokens


def test_n_choices_prefill_once_and_each_equals_its_own_seeded_request(server, client) -> None:
    before = metric(server, "tieredkv_prefill_tokens_total")
    forked = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        n=4,
        seed=11,
        temperature=1.0,
        max_tokens=16,
        extra_body={"cache_salt": "forks"},
    )
    computed = metric(server, "tieredkv_prefill_tokens_total") - before
    assert computed == forked.usage.prompt_tokens  # once, not four times
    assert [c.index for c in forked.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in forked.choices]
    assert len(set(texts)) > 1
    total = 0
    for i, text in enumerate(texts):
        alone = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            seed=11 + i,
            temperature=1.0,
            max_tokens=16,
            extra_body={"cache_salt": f"alone-{i}"},
        )
        assert alone.choices[0].message.content == text, f"choice {i}"
        total += alone.usage.completion_tokens
    assert forked.usage.completion_tokens == total


def test_streamed_choices_interleave_and_equal_the_non_streamed_ones(client) -> None:
    kwargs = dict(model=MODEL, messages=QUESTION, n=3, seed=5, temperature=0.8, max_tokens=12)
    full = client.chat.completions.create(**kwargs)
    parts: dict[int, list[str]] = {0: [], 1: [], 2: []}
    finishes: dict[int, str] = {}
    order = []
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            order.append(choice.index)
            parts[choice.index].append(choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert ["".join(parts[i]) for i in range(3)] == [c.message.content for c in full.choices]
    assert finishes == {c.index: c.finish_reason for c in full.choices}
    assert order != sorted(order)  # interleaved as the sequences advance, not one after another
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_completion_logprobs_equal_transformers_log_softmax(client, hf_model) -> None:
    prompt = "The longest river in Europe is"
    num_prompt, _ = prompt_ids(client, prompt)
    response = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3
    )
    ids = hf_ids(hf_model, prompt)
    assert len(ids) == num_prompt
    logprobs = response.choices[0].logprobs
    generated = [hf_token_id(hf_model, t) for t in logprobs.tokens]
    expected = hf_log_softmax(hf_model, ids + generated)
    for step, value in enumerate(logprobs.token_logprobs):
        row = expected[len(ids) - 1 + step]
        assert int(row.argmax()) == generated[step]  # greedy: the top one
        assert value == pytest.approx(float(row.max()), abs=TOLERANCE)
        assert_same_top(hf_model, logprobs.top_logprobs[step], row, 3)


def test_chat_logprobs_equal_transformers_log_softmax(client, hf_model) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=4,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 6
    assert all(entry.bytes == list(entry.token.encode()) for entry in content)
    # the prompt as transformers' own chat template renders it, scored by transformers
    ids = hf_tokenizer(hf_model).apply_chat_template(QUESTION, add_generation_prompt=True)
    ids = list(getattr(ids, "input_ids", ids))
    assert len(ids) == chat.usage.prompt_tokens
    generated = [hf_token_id(hf_model, entry.token) for entry in content]
    expected = hf_log_softmax(hf_model, ids + generated)
    for step, entry in enumerate(content):
        row = expected[len(ids) - 1 + step]
        assert int(row.argmax()) == generated[step]  # greedy: the top one
        assert entry.logprob == pytest.approx(float(row.max()), abs=TOLERANCE)
        top = {choice.token: choice.logprob for choice in entry.top_logprobs}
        assert len(top) == len(entry.top_logprobs) == 4
        assert_same_top(hf_model, top, row, 4)


def assert_same_top(hf_model, ours: dict[str, float], row: torch.Tensor, k: int) -> None:
    """`ours` (token text -> logprob) holds transformers' top k of `row`: the same tokens, each
    with its own value."""
    values, indices = row.topk(k)
    tokenizer = hf_tokenizer(hf_model)
    expected = {tokenizer.decode([int(i)]): float(v) for v, i in zip(values, indices, strict=True)}
    assert set(ours) == set(expected), (ours, expected)
    for token, value in expected.items():
        assert ours[token] == pytest.approx(value, abs=TOLERANCE), token


_TOKENIZERS: dict[int, transformers.PreTrainedTokenizerBase] = {}


def hf_tokenizer(hf_model) -> transformers.PreTrainedTokenizerBase:
    if id(hf_model) not in _TOKENIZERS:
        _TOKENIZERS[id(hf_model)] = transformers.AutoTokenizer.from_pretrained(
            hf_model.config._name_or_path
        )
    return _TOKENIZERS[id(hf_model)]


def hf_ids(hf_model, text: str) -> list[int]:
    return hf_tokenizer(hf_model)(text)["input_ids"]


def hf_token_id(hf_model, token_text: str) -> int:
    ids = hf_tokenizer(hf_model)(token_text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (token_text, ids)
    return ids[0]


def test_echo_prompt_logprobs_are_right_with_and_without_the_cache(client, hf_model) -> None:
    context = "Rivers of Europe: the Danube flows through ten countries, the Rhine " * 6
    warm = client.completions.create(model=MODEL, prompt=context, max_tokens=2, temperature=0)
    scored = client.completions.create(
        model=MODEL, prompt=context, max_tokens=2, temperature=0, echo=True, logprobs=2
    )
    assert warm.usage.prompt_tokens_details.cached_tokens == 0
    cold = client.completions.create(
        model=MODEL,
        prompt=context,
        max_tokens=2,
        temperature=0,
        echo=True,
        logprobs=2,
        extra_body={"cache_salt": "never-seen"},
    )
    first, second = scored.choices[0].logprobs, cold.choices[0].logprobs
    assert scored.choices[0].text.startswith(context)
    assert scored.choices[0].text == cold.choices[0].text
    assert first.tokens == second.tokens
    assert first.token_logprobs[0] is None and first.top_logprobs[0] is None
    assert first.token_logprobs[1:] == pytest.approx(second.token_logprobs[1:], abs=1e-6)
    ids = hf_ids(hf_model, context)
    num_prompt = scored.usage.prompt_tokens
    assert len(ids) == num_prompt
    expected = hf_log_softmax(hf_model, ids)
    for position in range(1, num_prompt):
        value = float(expected[position - 1, ids[position]])
        assert first.token_logprobs[position] == pytest.approx(value, abs=TOLERANCE)
    offsets = first.text_offset
    assert offsets[0] == 0 and offsets == sorted(offsets)


def test_best_of_returns_the_sequence_of_highest_logprob(client) -> None:
    prompt = "A short poem about the sea:"
    best = client.completions.create(
        model=MODEL, prompt=prompt, n=1, best_of=3, seed=21, temperature=1.0, max_tokens=10
    )
    assert best.choices[0].logprobs is None
    candidates = []
    for i in range(3):
        one = client.completions.create(
            model=MODEL, prompt=prompt, seed=21 + i, temperature=1.0, max_tokens=10, logprobs=0
        )
        candidates.append((sum(one.choices[0].logprobs.token_logprobs), one.choices[0].text))
    assert best.choices[0].text == max(candidates)[1]
    assert best.usage.completion_tokens == 30


def test_logit_bias_seed_and_stop(client, hf_model) -> None:
    target = hf_token_id(hf_model, " river")
    biased = client.completions.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=5,
        temperature=0,
        logit_bias={str(target): 100},
    )
    assert biased.choices[0].text == " river" * 5
    greedy = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=0
    )
    first = greedy.choices[0].logprobs.tokens[0]
    avoided = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        logit_bias={str(hf_token_id(hf_model, first)): -100},
        logprobs=0,
    )
    assert avoided.choices[0].logprobs.tokens[0] != first
    seeded = [
        client.completions.create(
            model=MODEL, prompt="Once upon a time", seed=3, temperature=1.2, max_tokens=12
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]
    stopped = client.completions.create(
        model=MODEL, prompt="Count: one, two, three,", max_tokens=20, temperature=0, stop=[","]
    )
    assert "," not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


def test_penalties_follow_openais_formula(client, hf_model) -> None:
    """Greedy with presence 0.6 / frequency 1.1 equals transformers' logits with OpenAI's
    documented adjustment (mu[j] -= c[j] * frequency + (c[j] > 0) * presence, over the tokens
    generated so far) applied step by step."""
    prompt = "List the numbers: 1, 2, 3, 4, 5, 6, 7, 8,"
    presence, frequency = 0.6, 1.1
    response = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logprobs=0,
    )
    ours = [hf_token_id(hf_model, t) for t in response.choices[0].logprobs.tokens]
    ids = hf_ids(hf_model, prompt)
    generated: list[int] = []
    for _ in range(len(ours)):
        with torch.no_grad():
            logits = hf_model(torch.tensor([ids + generated])).logits[0, -1].float()
        for token in set(generated):
            count = generated.count(token)
            logits[token] -= count * frequency + presence
        generated.append(int(logits.argmax()))
    assert ours == generated
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert plain.choices[0].text != response.choices[0].text  # the penalties changed something
    assert not math.isnan(sum(response.choices[0].logprobs.token_logprobs))

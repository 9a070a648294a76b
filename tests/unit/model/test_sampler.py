import pytest
import torch

from tieredkv.errors import RequestError
from tieredkv.model.sampler import Sampler, SamplingParams


def _logits(rows: int = 1, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(rows=4)
    params = [SamplingParams(temperature=0.0)] * 4
    assert Sampler(seed=0).sample(logits, params, [None] * 4) == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_even_with_temperature() -> None:
    logits = _logits()
    params = SamplingParams(temperature=5.0, top_k=1)
    assert params.greedy
    assert Sampler().sample(logits, [params], [None]) == [int(logits.argmax())]


def test_same_seed_same_tokens_whatever_the_batch() -> None:
    sampler = Sampler()
    seeded = SamplingParams(temperature=1.0, seed=1234)
    logits = _logits(rows=3)
    alone = [sampler.sample(logits[:1], [seeded], [sampler.new_generator(seeded)])[0]]
    alone.append(sampler.sample(logits[2:], [seeded], [sampler.new_generator(seeded)])[0])
    params = [seeded, SamplingParams(temperature=0.7), seeded]
    gens = [sampler.new_generator(seeded), None, sampler.new_generator(seeded)]
    batch = sampler.sample(logits, params, gens)
    assert [batch[0], batch[2]] == alone


def test_top_k_restricts_support() -> None:
    logits = _logits(vocab=20)
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    params = SamplingParams(temperature=2.0, top_k=3, seed=7)
    sampler = Sampler()
    generator = sampler.new_generator(params)
    draws = {sampler.sample(logits, [params], [generator])[0] for _ in range(200)}
    assert draws <= top3
    assert len(draws) > 1  # temperature 2 spreads mass over all three


def test_top_p_keeps_smallest_set_covering_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = SamplingParams(temperature=1.0, top_p=0.7, seed=3)
    sampler = Sampler()
    generator = sampler.new_generator(params)
    draws = {sampler.sample(logits, [params], [generator])[0] for _ in range(300)}
    assert draws == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 covers it


def test_banned_tokens_are_never_drawn() -> None:
    logits = torch.zeros(1, 5)
    logits[0, 2] = 10.0
    out = Sampler().sample(logits, [SamplingParams(temperature=0.0)], [None], [frozenset({2})])
    assert out != [2]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1.0), ("top_p", 0.0), ("top_k", -2), ("min_tokens", 99)],
)
def test_bad_values_name_their_field(field: str, value: object) -> None:
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field

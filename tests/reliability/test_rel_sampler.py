"""Sampling with a temperature so small that logits / temperature overflows fp32 must act like
greedy, not fail the engine step (found by the long schemathesis fuzz: a 500 for
`temperature: 1e-300`, and every request running beside it failed too)."""

from __future__ import annotations

import pytest
import torch

from tieredkv.model.sampler import Sampler, SamplingParams


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-40])
@pytest.mark.parametrize("extra", [{}, {"top_k": 5}, {"top_p": 0.5}], ids=["plain", "k", "p"])
def test_tiny_temperature_draws_the_argmax(temperature: float, extra: dict) -> None:
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(0)) * 10  # (3, vocab)
    params = [SamplingParams(temperature=temperature, seed=row, **extra) for row in range(3)]
    sampler = Sampler(seed=0)
    generators = [sampler.new_generator(p) for p in params]
    assert sampler.sample(logits, params, generators) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("top_p", [1e-300, 1.3e-251, 1e-46])
def test_tiny_top_p_keeps_the_top_token(top_p: float) -> None:
    """The fuzz's second find: a top_p that fp32 rounds to 0 dropped every token."""
    logits = torch.randn(2, 200, generator=torch.Generator().manual_seed(1)) * 10  # (2, vocab)
    params = [SamplingParams(temperature=1.0, top_p=top_p, seed=row) for row in range(2)]
    sampler = Sampler(seed=0)
    generators = [sampler.new_generator(p) for p in params]
    assert sampler.sample(logits, params, generators) == logits.argmax(-1).tolist()

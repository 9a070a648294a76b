"""Qwen3 and Gemma 3 (fp32) through the paged forward pass, against transformers on the same
directory: logits, greedy tokens, a prefix's pages plus the suffix, chunked prefill, batching.
The Gemma 3 model has a global layer between two sliding ones, linear RoPE scaling on the global
layers and a final logit soft-cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tests.model_factory import make_tiny_model_dir
from tests.support.greedy import generate_greedy
from tieredkv.model.gemma3 import Gemma3Model
from tieredkv.model.llama import LlamaModel
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner, PagedSequence

WINDOW = 64  # Gemma's sliding window: the passing tests stay inside it
GEMMA_LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
FAMILIES = {
    "qwen3": dict(arch="qwen3", head_dim=32),  # head_dim != hidden_size / heads
    "qwen3-tied": dict(arch="qwen3", head_dim=32, tie_word_embeddings=True),
    "gemma3": dict(
        arch="gemma3_text",
        num_layers=3,
        head_dim=32,
        layer_types=GEMMA_LAYERS,
        sliding_window=WINDOW,
        query_pre_attn_scalar=32,  # = head_dim: the default scale
        rope_theta=1_000_000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        rope_local_base_freq=10_000.0,
        final_logit_softcapping=3.0,
        tie_word_embeddings=True,
    ),
}
FAMILIES["gemma3-untied"] = {**FAMILIES["gemma3"], "tie_word_embeddings": False}


def tiny_family_model(tmp_path: Path, family: str, **overrides: object) -> Path:
    """A random-weight directory of `family` (a FAMILIES key), with overrides to its config."""
    return make_tiny_model_dir(
        tmp_path, init_std=0.5, name=family, **{**FAMILIES[family], **overrides}
    )


def load_pair(model_dir: Path, dtype: torch.dtype = torch.float32):
    ours = load_model(model_dir, dtype=dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return ours, hf


def make_runner(model: LoadedModel, num_pages: int = 256) -> ModelRunner:
    return ModelRunner.create(
        model.config, model.weights, num_pages=num_pages, page_size=4, max_model_len=512
    )


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    ours, hf = load_pair(tiny_family_model(tmp_path_factory.mktemp("m"), request.param))
    return ours, hf, make_runner(ours)


def prompt_of(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (length,), generator=generator).tolist()


def prefill(runner: ModelRunner, seq: PagedSequence, chunk: int | None = None) -> torch.Tensor:
    while True:
        logits = runner.forward([seq.next_chunk(runner.pool, chunk)])
        if seq.kv_len == len(seq.token_ids):
            return logits[0]


def done(runner: ModelRunner, *seqs: PagedSequence) -> None:
    for seq in seqs:
        runner.release(seq.seq_id)
        seq.free(runner.pool)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def hf_last_logits(hf: transformers.PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


def hf_greedy(hf: transformers.PreTrainedModel, ids: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def test_config_and_forward_class(pair) -> None:
    ours, _, runner = pair
    config = ours.config
    assert config.head_dim == 32 and config.hidden_size // config.num_heads == 16
    if config.architecture == "gemma3_text":
        assert isinstance(runner.model, Gemma3Model)
        assert config.layer_windows == (WINDOW, None, WINDOW)
        assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
        assert config.rope_scaling.kind == "linear" and config.rope_scaling.factor == 8.0
        assert config.attention_scale == 32**-0.5 and config.final_logit_softcapping == 3.0
        assert ("lm_head.weight" in ours.weights) is not config.tie_word_embeddings
    else:
        assert type(runner.model) is LlamaModel and config.layer_windows == ()
        assert runner.model.layers[0].qk_norm.shape == (config.num_heads + config.num_kv_heads, 32)
        assert ("lm_head.weight" in ours.weights) is not config.tie_word_embeddings


@pytest.mark.parametrize("length", [1, 7, 37])
def test_prefill_logits_match_transformers(pair, length: int) -> None:
    _, hf, runner = pair
    ids = prompt_of(length, seed=length)
    seq = PagedSequence(0, ids)
    ours = prefill(runner, seq)
    done(runner, seq)
    assert rel_err(ours, hf_last_logits(hf, ids)) < 1e-4


def test_greedy_tokens_match_transformers(pair) -> None:
    _, hf, runner = pair
    ids = prompt_of(21, seed=3)
    assert generate_greedy(runner, ids, max_new_tokens=24) == hf_greedy(hf, ids, 24)
    assert runner.pool.num_used == 0


@pytest.mark.parametrize(("prefix_len", "chunk"), [(16, None), (23, None), (0, 5), (12, 7)])
def test_prefix_pages_plus_suffix_equal_one_prefill(pair, prefix_len: int, chunk) -> None:
    """A prefix's KV copied into another sequence's pages, as a cache hit leaves it, then the
    suffix (whole or in chunks): the logits of one prefill, and transformers'."""
    _, hf, runner = pair
    ids = prompt_of(40, seed=5)
    whole = PagedSequence(1, list(ids))
    reference = prefill(runner, whole)
    reused = PagedSequence(2, list(ids))
    num_prefix_pages = -(-prefix_len // 4)
    reused.page_ids = runner.pool.alloc(num_prefix_pages)
    src = torch.tensor(whole.page_ids[:num_prefix_pages], dtype=torch.int64)
    runner.pool.kv[:, :, reused.page_ids] = runner.pool.kv[:, :, src]
    reused.kv_len = prefix_len
    cached = prefill(runner, reused, chunk)
    done(runner, whole, reused)
    assert rel_err(cached, reference) < 1e-4
    assert rel_err(cached, hf_last_logits(hf, ids)) < 1e-4


def test_batched_decode_equals_transformers(pair) -> None:
    _, hf, runner = pair
    prompts = [prompt_of(n, seed=n) for n in (3, 16, 29)]
    seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
    logits = torch.stack([prefill(runner, seq) for seq in seqs])
    for _ in range(6):
        for seq, row in zip(seqs, logits, strict=True):
            seq.token_ids.append(int(row.argmax()))
        logits = runner.forward([seq.next_chunk(runner.pool) for seq in seqs])
    for seq, row in zip(seqs, logits, strict=True):
        assert rel_err(row, hf_last_logits(hf, seq.token_ids)) < 1e-4
    done(runner, *seqs)
    assert [seq.token_ids[len(p) :] for seq, p in zip(seqs, prompts, strict=True)] == [
        hf_greedy(hf, p, 6) for p in prompts
    ]


@pytest.mark.parametrize("length", [30, 200])  # 200: long enough for the fused bf16 CPU ops
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_is_as_close_to_fp32_as_transformers_bf16(
    tmp_path: Path, family: str, length: int
) -> None:
    """bf16 rounding moves logits (Gemma's soft-cap at 3 squeezes them: more, relatively); ours
    stay about as close to the fp32 reference as transformers' own bf16 run."""
    overrides = {"sliding_window": 256} if family.startswith("gemma3") else {}
    model_dir = tiny_family_model(tmp_path, family, **overrides)
    ours, hf_bf16 = load_pair(model_dir, torch.bfloat16)
    hf_fp32 = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    runner = make_runner(ours)
    ids = prompt_of(length, seed=8)
    seq = PagedSequence(0, ids)
    logits = prefill(runner, seq)
    done(runner, seq)
    reference = hf_last_logits(hf_fp32.eval(), ids)
    theirs = rel_err(hf_last_logits(hf_bf16, ids), reference)
    assert rel_err(logits, reference) < 2 * theirs + 0.01


def test_gemma3_prompt_longer_than_the_window_matches_transformers(tmp_path: Path) -> None:
    ours, hf = load_pair(tiny_family_model(tmp_path, "gemma3", sliding_window=16))
    runner = make_runner(ours)
    ids = prompt_of(70, seed=9)
    seq = PagedSequence(0, list(ids))
    logits = prefill(runner, seq, chunk=24)
    done(runner, seq)
    assert rel_err(logits, hf_last_logits(hf, ids)) < 1e-4
    assert generate_greedy(runner, ids, max_new_tokens=12) == hf_greedy(hf, ids, 12)


def test_gemma3_query_pre_attn_scalar_scales_attention(tmp_path: Path) -> None:
    ours, hf = load_pair(tiny_family_model(tmp_path, "gemma3", query_pre_attn_scalar=8))
    assert ours.config.attention_scale == 8**-0.5
    runner = make_runner(ours)
    ids = prompt_of(30, seed=10)
    seq = PagedSequence(0, list(ids))
    logits = prefill(runner, seq)
    done(runner, seq)
    assert rel_err(logits, hf_last_logits(hf, ids)) < 1e-4

"""The paged forward pass against transformers, and against itself across cache splits (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from tests.support.greedy import generate_greedy
from tieredkv.model import llama
from tieredkv.model import runner as runner_module
from tieredkv.model.dtype import bf16_is_emulated
from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.hf_config import parse_model_config
from tieredkv.model.linear import PackedLinear, PlainLinear, WidenedLinear, packed_linear_works
from tieredkv.model.pointwise import Pointwise
from tieredkv.model.runner import ModelRunner, PagedSequence

VOCAB = 97


def _tiny_hf_model(arch: str) -> transformers.PreTrainedModel:
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    torch.manual_seed(1)
    if arch == "qwen2":
        config = transformers.Qwen2Config(**common, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
        # random init leaves biases at zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    else:
        config = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    # larger weights than the default init so that logits spread and ties are rare
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def hf_and_runner(
    request: pytest.FixtureRequest,
) -> tuple[transformers.PreTrainedModel, ModelRunner]:
    hf = _tiny_hf_model(request.param)
    config = parse_model_config(hf.config.to_dict(), Path(request.param))
    weights = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    runner = ModelRunner.create(config, weights, num_pages=256, page_size=4, max_model_len=512)
    return hf, runner


def _prompt(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def _prefill(runner: ModelRunner, seq: PagedSequence, chunk: int | None = None) -> torch.Tensor:
    while True:
        logits = runner.forward([seq.next_chunk(runner.pool, chunk)])
        if seq.kv_len == len(seq.token_ids):
            return logits[0]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("length", [1, 7, 16, 37])
def test_prefill_logits_match_transformers(hf_and_runner, length: int) -> None:
    hf, runner = hf_and_runner
    prompt = _prompt(length)
    seq = PagedSequence(0, prompt)
    ours = _prefill(runner, seq)
    runner.release(0)
    seq.free(runner.pool)
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0, -1]
    assert _rel_err(ours, theirs) < 1e-4


def test_greedy_generation_matches_transformers(hf_and_runner) -> None:
    hf, runner = hf_and_runner
    prompt = _prompt(21, seed=3)
    ours = generate_greedy(runner, prompt, max_new_tokens=24)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    assert ours == out[0, len(prompt) :].tolist()
    assert runner.pool.num_used == 0


@pytest.mark.parametrize(
    ("prefix_len", "chunk"), [(16, None), (20, None), (23, None), (0, 5), (12, 7)]
)
def test_prefix_pages_plus_suffix_equal_one_prefill(hf_and_runner, prefix_len: int, chunk) -> None:
    """A prompt prefilled whole vs. its prefix's KV already in the pool + the suffix (on and
    off a page boundary, page_size 4) vs. chunked prefill: same logits, same continuation."""
    _, runner = hf_and_runner
    prompt = _prompt(40, seed=5)
    whole = PagedSequence(1, list(prompt))
    reference = _prefill(runner, whole)

    # A second sequence whose first pages hold the prefix's KV, as a cache hit would.
    reused = PagedSequence(2, list(prompt))
    num_prefix_pages = -(-prefix_len // 4)
    reused.page_ids = runner.pool.alloc(num_prefix_pages)
    src = torch.tensor(whole.page_ids[:num_prefix_pages], dtype=torch.int64)
    runner.pool.kv[:, :, reused.page_ids] = runner.pool.kv[:, :, src]
    reused.kv_len = prefix_len
    cached = _prefill(runner, reused, chunk)
    assert _rel_err(cached, reference) < 1e-4

    steps = []
    for seq in (whole, reused):
        tokens = []
        logits = reference if seq is whole else cached
        for _ in range(8):
            token = int(logits.argmax())
            tokens.append(token)
            seq.token_ids.append(token)
            logits = runner.forward([seq.next_chunk(runner.pool)])[0]
        steps.append(tokens)
        runner.release(seq.seq_id)
        seq.free(runner.pool)
    assert steps[0] == steps[1]


def test_batched_decode_equals_decoding_alone(hf_and_runner) -> None:
    _, runner = hf_and_runner
    prompts = [_prompt(n, seed=n) for n in (3, 16, 29, 50)]
    alone = [
        generate_greedy(runner, p, max_new_tokens=10, seq_id=100 + i) for i, p in enumerate(prompts)
    ]

    seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
    logits = torch.stack([_prefill(runner, seq) for seq in seqs])
    outputs: list[list[int]] = [[] for _ in seqs]
    for _ in range(10):
        for seq, out, row in zip(seqs, outputs, logits, strict=True):
            out.append(int(row.argmax()))
            seq.token_ids.append(out[-1])
        logits = runner.forward([seq.next_chunk(runner.pool) for seq in seqs])
    for seq in seqs:
        runner.release(seq.seq_id)
        seq.free(runner.pool)
    assert outputs == alone


def test_workspace_path_equals_reference_kernels(hf_and_runner) -> None:
    """The CPU production path (workspaces) against the reference kernels over pages in place."""
    hf, runner = hf_and_runner
    config = parse_model_config(hf.config.to_dict(), Path("tiny"))
    weights = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    reference = ModelRunner.create(
        config, weights, num_pages=64, page_size=4, max_model_len=512, attention_backend="torch"
    )
    prompts = [_prompt(n, seed=n) for n in (9, 18)]
    for prompt in prompts:
        assert generate_greedy(reference, prompt, 12) == generate_greedy(runner, prompt, 12)
    chunks_a = [PagedSequence(i, p) for i, p in enumerate(prompts)]
    chunks_b = [PagedSequence(i, p) for i, p in enumerate(prompts)]
    ours = runner.forward([s.next_chunk(runner.pool) for s in chunks_a])
    ref = reference.forward([s.next_chunk(reference.pool) for s in chunks_b])
    assert _rel_err(ours, ref) < 1e-5
    for seq in chunks_a:
        runner.release(seq.seq_id)
        seq.free(runner.pool)


def test_chunk_past_its_pages_is_refused(hf_and_runner) -> None:
    _, runner = hf_and_runner
    with pytest.raises(AssertionError, match="cannot hold"):
        runner.forward([SequenceChunk(9, [1, 2, 3, 4, 5], 0, [0])])


def test_long_chunks_after_a_prefix_match_transformers(hf_and_runner) -> None:
    """511 tokens as chunks of 255 + 256: the second attends to its prefix and to itself apart
    (the log-sum-exp merge of 256+ queries), yet equals transformers' single pass in fp32."""
    hf, runner = hf_and_runner
    prompt = _prompt(511, seed=7)
    seq = PagedSequence(3, list(prompt))
    ours = _prefill(runner, seq, chunk=255)
    runner.release(3)
    seq.free(runner.pool)
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0, -1]
    assert _rel_err(ours, theirs) < 1e-4


def test_bf16_fused_path_stays_close_to_eager(hf_and_runner, monkeypatch) -> None:
    """bf16 on CPU: packed linears and fused elementwise ops against the same model run with
    plain F.linear and eager ops (bf16 rounding differs between them; the answer must not)."""
    hf, _ = hf_and_runner
    config = parse_model_config(hf.config.to_dict(), Path("bf16"))
    weights = {name: t.detach().to(torch.bfloat16) for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    prompt = _prompt(300, seed=9)

    def last_logits() -> tuple[ModelRunner, torch.Tensor]:
        runner = ModelRunner.create(config, weights, num_pages=256, page_size=4, max_model_len=512)
        seq = PagedSequence(4, list(prompt))
        logits = _prefill(runner, seq).float()
        runner.release(4)
        seq.free(runner.pool)
        return runner, logits

    fast, fused_logits = last_logits()
    packed = packed_linear_works(torch.bfloat16, torch.device("cpu"))
    widened = bf16_is_emulated(torch.device("cpu"))
    fast_kind = WidenedLinear if widened else PackedLinear
    assert isinstance(fast.model.layers[0].qkv, fast_kind) == packed
    monkeypatch.setattr(llama, "packed_linear_works", lambda dtype, device: False)
    monkeypatch.setattr(llama, "make_pointwise", lambda config, dtype, device: Pointwise())
    plain, eager_logits = last_logits()
    assert isinstance(plain.model.layers[0].qkv, PlainLinear)
    assert _rel_err(fused_logits, eager_logits) < 0.05


@pytest.mark.parametrize("max_seqs", [16, 2])  # 2: the third sequence has a workspace of its own
@pytest.mark.parametrize("matmul", [False, True], ids=["sdpa", "matmul"])
def test_decodes_attended_together_equal_each_alone(
    hf_and_runner, max_seqs: int, matmul: bool, monkeypatch
) -> None:
    """Decodes whose workspaces are arena slots attend in one masked call over the slot range
    (SDPA, or the blocked-matmul path forced here); in fp32 each one's logits equal those of the
    same sequence decoded alone (to the rounding that a batch of rows already brings to the
    matmuls)."""
    hf, _ = hf_and_runner
    monkeypatch.setattr(runner_module, "prefers_matmul_attention", lambda dtype, device: matmul)
    config = parse_model_config(hf.config.to_dict(), Path("arena"))
    weights = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)

    def runner() -> ModelRunner:
        return ModelRunner.create(
            config, weights, num_pages=256, page_size=4, max_model_len=512, max_seqs=max_seqs
        )

    prompts = [_prompt(length, seed=20 + length) for length in (9, 30, 17)]
    together = runner()
    seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
    for seq in seqs:
        _prefill(together, seq)
    steps = []
    for token in (5, 6, 7):
        for seq in seqs:
            seq.token_ids.append(token)
        steps.append(together.forward([seq.next_chunk(together.pool) for seq in seqs]))
        group = together.attention._decodes  # the decodes in arena slots went through one call
        assert group is not None and len(group.rows) == min(max_seqs, len(seqs))
    for i, prompt in enumerate(prompts):
        alone = runner()
        seq = PagedSequence(i, list(prompt))
        _prefill(alone, seq)
        for step, token in enumerate((5, 6, 7)):
            seq.token_ids.append(token)
            logits = alone.forward([seq.next_chunk(alone.pool)])[0]
            torch.testing.assert_close(steps[step][i], logits, rtol=1e-4, atol=1e-5)


def test_matmul_attention_path_equals_transformers_in_fp32(hf_and_runner, monkeypatch) -> None:
    """The blocked-matmul attention (chosen for bf16 on a CPU without AMX), forced here in fp32:
    chunked prefills after a prefix and decodes of several sequences in one step (each alone
    on this path) equal transformers' logits and greedy tokens."""
    hf, _ = hf_and_runner
    config = parse_model_config(hf.config.to_dict(), Path("matmul"))
    weights = {name: t.detach().clone() for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    monkeypatch.setattr(runner_module, "prefers_matmul_attention", lambda dtype, device: True)
    runner = ModelRunner.create(config, weights, num_pages=256, page_size=4, max_model_len=512)
    assert runner.attention.matmul
    prompt = _prompt(300, seed=11)
    seq = PagedSequence(5, list(prompt))
    ours = _prefill(runner, seq, chunk=130)  # blocks of 128 queries, crossed after a prefix
    runner.release(5)
    seq.free(runner.pool)
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0, -1]
    assert _rel_err(ours, theirs) < 1e-4
    prompts = [_prompt(n, seed=n) for n in (9, 18, 25)]
    seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
    for s in seqs:
        _prefill(runner, s)
    for token in (5, 6):
        for s in seqs:
            s.token_ids.append(token)
        step = runner.forward([s.next_chunk(runner.pool) for s in seqs])
        for i, s in enumerate(seqs):
            with torch.no_grad():
                expected = hf(torch.tensor([s.token_ids])).logits[0, -1]
            assert _rel_err(step[i], expected) < 1e-4
    for s in seqs:
        runner.release(s.seq_id)
        s.free(runner.pool)
    assert (
        generate_greedy(runner, prompts[1], 12)
        == hf.generate(torch.tensor([prompts[1]]), max_new_tokens=12, do_sample=False)[
            0, len(prompts[1]) :
        ].tolist()
    )


def test_bf16_decodes_in_the_c_kernels_stay_close_to_the_matmul_path(
    hf_and_runner, monkeypatch
) -> None:
    """bf16 on the matmul path (forced here, whatever the CPU): a step's decodes, one in a
    workspace of its own, go to the C kernels in one call a layer; their logits stay close to
    those of the same steps with the kernels unavailable (torch matmuls, bf16 rounding)."""
    if runner_module.load_cpu_kernels() is None:
        pytest.skip("gcc could not build the CPU kernels")
    hf, _ = hf_and_runner
    monkeypatch.setattr(runner_module, "prefers_matmul_attention", lambda dtype, device: True)
    config = parse_model_config(hf.config.to_dict(), Path("kernels"))
    weights = {name: t.detach().to(torch.bfloat16) for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    prompts = [_prompt(length, seed=40 + length) for length in (9, 300, 17)]

    def decode_steps() -> tuple[ModelRunner, list[torch.Tensor]]:
        runner = ModelRunner.create(
            config, weights, num_pages=256, page_size=4, max_model_len=512, max_seqs=2
        )
        seqs = [PagedSequence(i, list(p)) for i, p in enumerate(prompts)]
        for seq in seqs:
            _prefill(runner, seq)
        steps = []
        for token in (5, 6, 7):
            for seq in seqs:
                seq.token_ids.append(token)
            steps.append(runner.forward([seq.next_chunk(runner.pool) for seq in seqs]).float())
        return runner, steps

    with_kernels, fast = decode_steps()
    assert with_kernels.attention.kernels is not None
    table = with_kernels.attention._decode_table
    assert table is not None and len(table) == 3  # two arena slots and a spare, one call
    monkeypatch.setattr(runner_module, "load_cpu_kernels", lambda: None)
    without, slow = decode_steps()
    assert without.attention.kernels is None
    for ours, theirs in zip(fast, slow, strict=True):
        assert _rel_err(ours, theirs) < 0.05

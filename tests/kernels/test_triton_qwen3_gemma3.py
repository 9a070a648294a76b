"""Qwen3 and Gemma 3 through the Triton kernels (the paged path a CUDA device runs; interpreted
on CPU) equal the torch reference kernels and transformers (fp32): a chunked prefill, a second
sequence on the first one's pages, batched decodes. Gemma's window (64) holds the sequences."""

import pytest
import torch
import transformers

from tests.kernels.test_triton_forward import DECODE_STEPS, PAGE_SIZE, make_runner, run_script
from tests.unit.model.test_qwen3_gemma3_forward import tiny_family_model
from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.cache.pools.split_device_pool import SplitDevicePool
from tieredkv.model.loader import load_model
from tieredkv.model.runner import ModelRunner


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_forward_through_triton_equals_torch_and_transformers(
    triton_kernels, device, tmp_path, family: str
) -> None:
    model_dir = tiny_family_model(tmp_path, family)
    model = load_model(model_dir, dtype=torch.float32)
    torch_runner = make_runner(model, "torch", device)
    triton_runner = make_runner(model, "triton", device)
    assert triton_runner.attention.kernels.name == "triton"
    expected_logits, expected_tokens = run_script(torch_runner)
    logits, tokens = run_script(triton_runner)
    assert logits.shape == (3 + 2 * DECODE_STEPS, model.config.vocab_size)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    assert tokens == expected_tokens
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = torch.randint(3, 300, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        generated = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=DECODE_STEPS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert tokens[0] == generated[0, len(prompt) :].tolist()  # the first sequence's decodes


def test_a_split_device_pool_through_triton_equals_whole_pages(
    triton_kernels, device, tmp_path
) -> None:
    """Gemma 3 with a 16-token window on a pool kept a layer at a time: the kernels read each
    layer through its own page table, and a page whose sliding part was freed once both
    sequences' windows passed it is read by neither (zeros there change nothing)."""
    model_dir = tiny_family_model(tmp_path, "gemma3", sliding_window=16)
    model = load_model(model_dir, dtype=torch.float32)
    layout = PageLayout.for_model(model.config, PAGE_SIZE, torch.float32)
    split = SplitDevicePool.from_bytes(
        PageParts.of(model.config, layout), 16 * layout.page_bytes, device
    )
    runner = ModelRunner(model.config, model.weights, split, 128, attention_backend="triton")
    page_zero = [0]

    def passed(pool) -> None:  # after a's prefill: every later query reads keys 17 and on
        if pool is split and 0 in split.sliding_of:
            split.detach_sliding(page_zero)

    logits, tokens = run_script(runner, after_prefill=passed)
    expected_logits, expected_tokens = run_script(make_runner(model, "torch", device))
    assert 0 not in split.sliding_of
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    assert tokens == expected_tokens

"""Qwen3 and Gemma 3 through the Triton kernels (the paged path a CUDA device runs; interpreted
on CPU) equal the torch reference kernels and transformers (fp32): a chunked prefill, a second
sequence on the first one's pages, batched decodes. Gemma's window (64) holds the sequences."""

import pytest
import torch
import transformers

from tests.kernels.test_triton_forward import DECODE_STEPS, make_runner, run_script
from tests.unit.model.test_qwen3_gemma3_forward import tiny_family_model
from tieredkv.model.loader import load_model


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
